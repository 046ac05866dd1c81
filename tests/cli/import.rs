//! `trellis import fixie`: suites written from a Fixie agent's few-shots, checked and run
//! against the agent they came from (the builtin `numbers`, served on loopback).

use serde_json::json;
use trellis_agents::fixie::{BASE_PROMPT, FEW_SHOTS};
use trellis_agents::{self as builtin, BuiltinServer};

use super::*;

async fn numbers() -> BuiltinServer {
    builtin::serve("numbers").await.unwrap()
}

async fn import(args: &[&str]) -> Output {
    trellis()
        .args(["import", "fixie"])
        .args(args)
        .output()
        .await
        .unwrap()
}

/// Checks `suite`, runs it, and returns the run's console output; fails unless every
/// trajectory passed.
async fn check_and_run(suite: &Path, out: &Path) -> String {
    let o = trellis().arg("check").arg(suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = trellis()
        .arg("run")
        .arg(suite)
        .arg("--out")
        .arg(out)
        .output()
        .await
        .unwrap();
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", stderr(&o));
    text
}

#[tokio::test]
async fn imported_from_the_agents_url_the_suite_passes_against_it() {
    let agent = numbers().await;
    let dir = tempfile::tempdir().unwrap();
    // README's example writes into a `suites/` that need not exist yet.
    let suite = dir.path().join("suites").join("numbers.kdl");
    let o = import(&[
        &agent.url(),
        "--out",
        suite.to_str().unwrap(),
        "--name",
        "numbers",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(text.contains(&format!("url=\"{}\"", agent.url())), "{text}");
    assert!(
        text.contains("call \"genrand\" \"0, 19\"\n    expect reply equals=\"17\""),
        "{text}"
    );
    assert!(
        text.contains("call \"add\" \"5, 10\"\n    expect reply equals=\"15\""),
        "{text}"
    );
    // What cannot be checked stays as comments.
    assert!(
        text.contains("    // Q: Generate a random number between 0 and 19."),
        "{text}"
    );
    assert!(
        text.contains("    // Ask Agent[weather]: What is the weather in Paris?"),
        "{text}"
    );
    assert!(text.contains("    // A: You rolled a 5."), "{text}");

    let run = check_and_run(&suite, &dir.path().join("run")).await;
    assert!(run.contains("3 passed, 0 failed"), "{run}");
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn imported_from_saved_json_and_yaml_handshakes_the_suite_passes() {
    let agent = numbers().await;
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("handshake.json");
    std::fs::write(
        &json_file,
        json!({"base_prompt": BASE_PROMPT, "few_shots": FEW_SHOTS}).to_string(),
    )
    .unwrap();
    // Later SDKs answer YAML with more fields than the spec names.
    let mut yaml = format!(
        "base_prompt: {}\nconversational: false\ncorpora: null\nfew_shots:\n",
        json!(BASE_PROMPT)
    );
    for shot in FEW_SHOTS {
        yaml.push_str(&format!("- {}\n", json!(shot)));
    }
    let yaml_file = dir.path().join("handshake.yaml");
    std::fs::write(&yaml_file, yaml).unwrap();

    for (source, name) in [(&json_file, "from-json"), (&yaml_file, "from-yaml")] {
        let suite = dir.path().join(format!("{name}.kdl"));
        let o = import(&[
            source.to_str().unwrap(),
            "--url",
            &agent.url(),
            "--name",
            name,
            "--out",
            suite.to_str().unwrap(),
        ])
        .await;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let run = check_and_run(&suite, &dir.path().join(format!("run-{name}"))).await;
        assert!(run.contains("3 passed, 0 failed"), "{name}: {run}");
    }
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn quotes_backslashes_and_line_breaks_reach_the_agent_and_the_check_exactly() {
    let agent = numbers().await;
    let dir = tempfile::tempdir().unwrap();
    let tricky = "say \"hi\" \\ C:\\path\\n\n\ttab /* not a comment */ // nor this";
    let handshake = json!({
        "base_prompt": "Echoes.",
        "few_shots": [
            format!("Q: Echo it.\nAsk Func[echo]: {tricky}\nFunc[echo] says: {tricky}\nA: Done."),
            "Q: Only words.\nA: Nothing to call.",
        ],
    });
    let file = dir.path().join("handshake.json");
    std::fs::write(&file, handshake.to_string()).unwrap();
    let suite = dir.path().join("echo.kdl");
    let o = import(&[
        file.to_str().unwrap(),
        "--url",
        &agent.url(),
        "--out",
        suite.to_str().unwrap(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    // The few-shot without a function is kept, commented out.
    assert!(text.contains("// Few-shot 2 calls no function"), "{text}");

    let out = dir.path().join("run");
    let run = check_and_run(&suite, &out).await;
    assert!(run.contains("1 passed, 0 failed"), "{run}");
    // The agent was sent exactly the few-shot's argument (the lines of a few-shot are
    // trimmed, so the input's second line arrives without its leading tab).
    let journal = crate::journal_text(&out);
    let sent = json!("say \"hi\" \\ C:\\path\\n\ntab /* not a comment */ // nor this");
    assert!(
        journal.contains(&format!("\"user_message\":{sent}")),
        "{journal}"
    );
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn template_braces_are_sent_and_expected_literally() {
    let agent = numbers().await;
    let dir = tempfile::tempdir().unwrap();
    let braces = "{{ 6 * 7 }} {% if x %} {# no #} {a}";
    let handshake = json!({
        "few_shots": [format!("Q: Braces.\nAsk Func[echo]: {braces}\nFunc[echo] says: {braces}\nA: ok")],
    });
    let file = dir.path().join("handshake.json");
    std::fs::write(&file, handshake.to_string()).unwrap();
    let suite = dir.path().join("braces.kdl");
    let o = import(&[
        file.to_str().unwrap(),
        "--url",
        &agent.url(),
        "--out",
        suite.to_str().unwrap(),
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = check_and_run(&suite, &dir.path().join("run")).await;
    assert!(run.contains("1 passed, 0 failed"), "{run}");
    agent.shutdown().await.unwrap();
}

#[tokio::test]
async fn unreadable_sources_and_existing_outputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("handshake.txt");
    std::fs::write(&garbage, "{ \"few_shots\": [unclosed").unwrap();
    let o = import(&[garbage.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("neither JSON"), "{}", stderr(&o));

    let addr = support::closed_port().await;
    let o = import(&[&format!("http://{addr}")]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("Fixie handshake `GET /` failed"),
        "{}",
        stderr(&o)
    );

    // An answer without few-shots names the fields it has, `base_prompt` included.
    let no_shots = dir.path().join("no-shots.json");
    std::fs::write(&no_shots, r#"{"base_prompt":"p","name":"n"}"#).unwrap();
    let o = import(&[no_shots.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no `few_shots` (fields: base_prompt, name)"),
        "{}",
        stderr(&o)
    );
    // An address without its scheme is not a file: say how to fetch from it.
    let o = import(&["127.0.0.1:8181"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("http://127.0.0.1:8181"),
        "{}",
        stderr(&o)
    );

    let good = dir.path().join("handshake.json");
    std::fs::write(&good, r#"{"base_prompt":"p","few_shots":[]}"#).unwrap();
    let existing = dir.path().join("suite.kdl");
    std::fs::write(&existing, "// mine").unwrap();
    let o = import(&[good.to_str().unwrap(), "--out", existing.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "// mine");
    let o = import(&[
        good.to_str().unwrap(),
        "--out",
        existing.to_str().unwrap(),
        "--force",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        std::fs::read_to_string(&existing)
            .unwrap()
            .contains("protocol=\"fixie\"")
    );
}

#[tokio::test]
async fn headers_are_sent_with_the_handshake_and_written_to_the_agent() {
    let agent = support::MisbehavingServer::respond(
        200,
        r#"{"base_prompt":"p","few_shots":["Q: q\nAsk Func[add]: 1, 2\nFunc[add] says: 3\nA: 3"]}"#,
    )
    .await;
    let url = format!("http://{}", agent.addr);
    let o = import(&[&url, "--header", "Authorization: Bearer s3cret {{ x }}"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let seen = agent.recorded();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization").as_deref(),
        Some("Bearer s3cret {{ x }}")
    );
    // Header values are templates: the braces are written so they render as given.
    let suite = stdout(&o);
    let expected = format!(
        "agent \"fixie\" protocol=\"fixie\" url=\"{url}\" {{\n    header \"Authorization\" {}\n}}",
        r#""Bearer s3cret {{ \"{\" }}{ x }}""#
    );
    assert!(suite.contains(&expected), "{suite}");
    assert!(stderr(&o).contains("--header values"), "{}", stderr(&o));
}

#[tokio::test]
async fn imported_next_to_the_example_fixie_suite_the_directory_still_checks() {
    // `trellis import fixie URL --out suites/my-agent.kdl` (the help's own example) must not
    // write a second suite and agent named `fixie` next to suites/fixie.kdl.
    let agent = numbers().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo("suites/fixie.kdl"), dir.path().join("fixie.kdl")).unwrap();
    let suite = dir.path().join("my-agent.kdl");
    let o = import(&[&agent.url(), "--out", suite.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(text.contains("suite \"my-agent\""), "{text}");
    assert!(
        text.contains("agent \"my-agent\" protocol=\"fixie\""),
        "{text}"
    );

    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    agent.shutdown().await.unwrap();
}
