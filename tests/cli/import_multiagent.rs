//! `trellis import multiagent`: MultiAgentEval scenario files (tests/fixtures/multiagent/
//! scenarios, one per generation and the awkward cases) imported and compared with the
//! suites expected (tests/fixtures/multiagent/expected), then checked by `trellis check`.
//!
//! The expected suites are golden files: after a deliberate change to the importer's
//! output, rewrite them with `TRELLIS_UPDATE_GOLDENS=1 cargo test --test cli import_multiagent`
//! and review the diff.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::json;

use super::*;

const SCENARIOS: &str = "tests/fixtures/multiagent/scenarios";
const EXPECTED: &str = "tests/fixtures/multiagent/expected";

async fn import(args: &[&str]) -> Output {
    trellis()
        .args(["import", "multiagent"])
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
async fn every_generation_imports_as_the_golden_suites_and_they_check() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imported");
    let o = import(&[SCENARIOS, "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    // Three files cannot be imported (exit 1); the others are written anyway.
    assert_eq!(o.status.code(), Some(1), "{err}");
    for expected in [
        "awkward/cycle.json: the workflow's edges form a cycle through `a`, `b`",
        "awkward/empty-nodes.json: the scenario has no workflow nodes",
        "awkward/not-json.json: not JSON: EOF while parsing",
        "imported 5 of 8 files",
        "3 could not be imported",
        // Unmapped parts are reported per file, naming the field and why.
        "awkward/odd-values.json: 20 items not mapped:",
        "(unknown assertion mode `fuzzy`)",
        "`evaluation.consensus`",
        "`ground_truth_history` (2 entries",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }

    let written = tree(&out);
    if std::env::var_os("TRELLIS_UPDATE_GOLDENS").is_some() {
        let _ = std::fs::remove_dir_all(repo(EXPECTED));
        for (path, text) in &written {
            let target = repo(EXPECTED).join(path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, text).unwrap();
        }
    }
    let expected = tree(&repo(EXPECTED));
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "the files written differ from the goldens"
    );
    for (path, text) in &written {
        assert_eq!(
            text,
            &expected[path],
            "{} differs from its golden; if the change is intended, rerun with \
             TRELLIS_UPDATE_GOLDENS=1",
            path.display()
        );
    }

    // Harness metric names are never judge statements: a policy metric is a deterministic
    // check, an unknown one a comment; AES files' agents get the AgentV request form; a
    // top-level description is the scenario's; what is not mapped is kept whole.
    let aes = &written[Path::new("aes/refund-workflow.kdl")];
    assert!(!aes.contains("judge \"task_completion\""), "{aes}");
    assert!(aes.contains("        violations max=0\n"), "{aes}");
    let agents = &written[Path::new("agents.kdl")];
    assert!(
        agents.contains("max-actions=8 {\n    request \"task-only\"\n}"),
        "{agents}"
    );
    let odd = &written[Path::new("awkward/odd-values.kdl")];
    assert!(
        odd.contains("description \"A top-level description, as hand-written AES files put it.\""),
        "{odd}"
    );
    assert!(odd.contains("tail end kept"), "not cut short: {odd}");

    // The whole directory checks, and so does each suite alone (it includes the agents).
    let o = check(&out).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("ok: 6 files, 5 suites, 5 scenarios, 5 trajectories, 4 agents"),
        "{}",
        stdout(&o)
    );
    let o = check(&out.join("legacy/billing-dispute.kdl")).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    // Existing outputs are refused, and replaced with --replace.
    let o = import(&[SCENARIOS, "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--replace"), "{}", stderr(&o));
    let o = import(&[SCENARIOS, "--out", out.to_str().unwrap(), "--replace", "-q"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not mapped:"), "{}", stderr(&o));
    assert_eq!(tree(&out), written);
}

#[tokio::test]
async fn a_single_file_is_one_self_contained_suite() {
    let source = format!("{SCENARIOS}/legacy/billing-dispute.json");
    let o = import(&[&source]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let suite = stdout(&o);
    assert!(
        suite.contains(
            "agent \"multiagent\" protocol=\"multiagent\" builtin=\"support\"\n\nsuite \
             \"billing-dispute\""
        ),
        "{suite}"
    );
    assert!(!suite.contains("include"), "{suite}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("billing.kdl");
    let o = import(&[
        &source,
        "--out",
        file.to_str().unwrap(),
        "--agent-url",
        "http://127.0.0.1:9/execute_task",
        "--agent-id",
        "billing-agent",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains(
            "agent \"billing-agent\" protocol=\"multiagent\" url=\"http://127.0.0.1:9/execute_task\""
        ),
        "{text}"
    );
    assert!(text.contains("suite \"billing\""), "{text}");
    let o = check(&file).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = import(&[&source, "--out", file.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // Every kind of endpoint makes a suite that checks; a bad one is refused up front.
    for (option, value, written) in [
        (
            "--agent-command",
            "python3 agent.py",
            "command=\"python3 agent.py\"",
        ),
        (
            "--agent-socket",
            "tcp:127.0.0.1:9100",
            "socket=\"tcp:127.0.0.1:9100\"",
        ),
        (
            "--agent-socket",
            "unix:///tmp/agent.sock",
            "socket=\"unix:///tmp/agent.sock\"",
        ),
        ("--agent-builtin", "support", "builtin=\"support\""),
    ] {
        let o = import(&[&source, option, value]).await;
        assert_eq!(o.status.code(), Some(0), "{option} {value}: {}", stderr(&o));
        assert!(stdout(&o).contains(written), "{}", stdout(&o));
    }
    let o = import(&[&source, "--agent-socket", "tcp:no-port"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the agent options do not make a valid agent"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "");

    // A file that cannot be imported: exit 1, the reason, nothing on standard output.
    let o = import(&[&format!("{SCENARIOS}/awkward/cycle.json")]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("cycle"), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");

    // Usage errors: exit 2.
    let o = import(&[SCENARIOS]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("needs --out DIR"), "{}", stderr(&o));
    let empty = tempfile::tempdir().unwrap();
    let o = import(&[empty.path().to_str().unwrap(), "--out", "unused"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no .json scenario files"),
        "{}",
        stderr(&o)
    );
}

/// A scenario file of generation `n % 3`, with tools, policies, state and assertions.
fn generated(n: usize) -> serde_json::Value {
    let tools = json!({
        "lookup": {"output": {"status": "success", "n": n}},
        "refund": {"output": "ok", "state_changes": [{"path": "orders.0.status", "value": "refunded"}]},
    });
    match n % 3 {
        0 => json!({
            "aes_version": 1.4,
            "metadata": {"id": format!("s-{n}"), "name": format!("Scenario {n}"), "compliance_level": "Standard"},
            "initial_state": {"orders": [{"status": "open"}]},
            "tools": tools,
            "policies": {"refund": {"max_limit": 50}},
            "workflow": {
                "nodes": (0..5).map(|i| json!({
                    "id": format!("n{i}"),
                    "task_description": format!("Step {i} of scenario {n}"),
                    "expected_outcome": [
                        {"target": "message", "expected": format!("regex:step {i}")},
                        {"target": "state", "property": "orders.0.status", "expected": "refunded"},
                    ],
                    "required_tools": ["refund"],
                    "success_criteria": [{"metric": "luna_judge_score", "threshold": 0.7}],
                })).collect::<Vec<_>>(),
                "edges": (0..4).rev().map(|i| json!({"from": format!("n{i}"), "to": format!("n{}", i + 1)})).collect::<Vec<_>>(),
            },
            "evaluation": {"metrics": [{"metric": "task_completion", "threshold": 0.8}]},
        }),
        1 => json!({
            "aes_version": 1.4,
            "metadata": {"id": format!("t-{n}")},
            "tools": tools,
            "workflow": {
                "nodes": [
                    {"id": "a", "task_description": "First", "expected_outcome": {"type": "typed_value", "data_type": "string", "value": "Done"}},
                    {"id": "b", "task_description": "Second", "expected_outcome": null},
                ],
                "edges": [{"from": "a", "to": "b"}],
            },
        }),
        _ => json!({
            "scenario_id": format!("legacy_{n}"),
            "title": "Legacy",
            "industry": "retail",
            "tasks": [
                {"task_id": "t1", "description": "Refund me", "expected_outcome": "A refund", "required_tools": ["refund"],
                 "success_criteria": [{"metric": "accuracy", "threshold": 0.9, "requires_llm_judge": true}]},
                {"task_id": "t2", "description": "Thanks", "expected_outcome": "A goodbye"},
            ],
            "policies": {"refund": {"max_limit": 100}},
        }),
    }
}

#[tokio::test]
async fn thousands_of_files_import_in_well_under_a_few_seconds() {
    const FILES: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("corpus");
    for n in 0..FILES {
        // Spread over subdirectories, as the public corpus is.
        let sub = source.join(format!("domain-{}", n % 20));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(
            sub.join(format!("scenario-{n}.json")),
            generated(n).to_string(),
        )
        .unwrap();
    }
    let out = dir.path().join("suites");
    let started = Instant::now();
    // --no-check: loading thousands of suites back is `trellis check`'s work, timed apart.
    let o = import(&[
        source.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
        "--no-check",
    ])
    .await;
    let elapsed = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    println!("imported {FILES} scenario files in {elapsed:?} (debug build)");
    assert!(
        stderr(&o).contains(&format!("imported {FILES} of {FILES} files")),
        "{}",
        stderr(&o)
    );
    // A loose bound: the point is "no quadratic work", not a benchmark.
    assert!(elapsed.as_secs() < 30, "{elapsed:?}");
    assert_eq!(tree(&out).len(), FILES + 1);

    // One suite of each generation checks (each includes the shared agents file).
    for n in 0..3 {
        let suite = out.join(format!("domain-{n}/scenario-{n}.kdl"));
        let o = check(&suite).await;
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    }
}

#[tokio::test]
async fn an_empty_file_says_so_and_an_odd_id_is_made_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "").unwrap();
    let out = dir.path().join("out.kdl");
    let o = import(&[empty.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("the file is empty"), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing imported"), "{}", stderr(&o));
    assert!(!out.exists());

    // An id with a line break and brackets: one line, no instance brackets.
    let odd = dir.path().join("odd.json");
    std::fs::write(
        &odd,
        r#"{"scenario_id": "refund\nfor [vip]",
            "tasks": [{"id": "t1", "description": "Refund order A-1", "expected_outcome": "refunded"}]}"#,
    )
    .unwrap();
    let o = import(&[odd.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let suite = std::fs::read_to_string(&out).unwrap();
    assert!(suite.contains("scenario \"refund for -vip-\""), "{suite}");
    assert_eq!(check(&out).await.status.code(), Some(0));
}

/// A `judge_rubric` trellis has (or a rubric's text) is written as `rubric=`; any other name
/// (a misspelt one, a plugin's) is reported and judged with the default rubric. The misspelt one failed the
/// whole file as "internal"; an unknown one reached the judge as the rubric's text.
#[tokio::test]
async fn a_judge_rubric_trellis_does_not_have_is_reported_not_sent_or_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ds.json");
    std::fs::write(
        &file,
        r#"{"aes_version": 1.4, "metadata": {"name": "DS", "id": "ds-1"},
 "workflow": {"nodes": [{"id": "a", "task_description": "hi",
   "success_criteria": [
     {"metric": "typo_score", "threshold": 0.85, "judge_config": {"judge_rubric": "policy_adherance"}},
     {"metric": "plugin_score", "threshold": 0.5, "judge_config": {"judge_rubric": "hipaa_custom"}},
     {"metric": "known_score", "threshold": 0.5, "judge_config": {"judge_rubric": "policy_adherence"}},
     {"metric": "spelt_score", "threshold": 0.5, "judge_config": {"judge_rubric": "Policy-Adherence"}}]}],
   "edges": []},
 "evaluation": {}}"#,
    )
    .unwrap();
    let out = dir.path().join("out.kdl");
    let o = import(&[file.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let suite = std::fs::read_to_string(&out).unwrap();
    assert!(
        suite.contains("expect judge \"The agent handles this request well: hi\" threshold=0.5 rubric=\"policy_adherence\""),
        "{suite}"
    );
    assert!(
        suite.contains("expect judge \"The agent handles this request well: hi\" threshold=0.5 rubric=\"policy_adherence\""),
        "{suite}"
    );
    for name in ["policy_adherance", "hipaa_custom"] {
        assert!(!suite.contains(&format!("rubric=\"{name}\"")), "{suite}");
        assert!(
            suite.contains(&format!(
                "judge_config.judge_rubric `{name}` names no rubric trellis has"
            )),
            "{suite}"
        );
    }
    assert_eq!(check(&out).await.status.code(), Some(0));
}

/// The judge is asked the file's own words: a `judge_rubric` written as a question (or an
/// `expected` statement), not the metric's id, which means nothing to a judge.
#[tokio::test]
async fn a_judged_metric_asks_the_judge_the_files_question_not_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.json");
    std::fs::write(
        &file,
        r#"{"aes_version": 1.4, "metadata": {"name": "Q", "id": "q-1"},
 "workflow": {"nodes": [{"id": "a", "task_description": "refund A1",
   "success_criteria": [
     {"metric": "luna_judge_score", "threshold": 0.8,
      "judge_config": {"judge_rubric": "Did the agent refund order A1 without exceeding policy?"}},
     {"metric": "tone_score", "threshold": 0.6, "expected": "The agent apologises once",
      "judge_config": {"judge_rubric": "Grade the tone from 0 to 1."}},
     {"metric": "luna_judge_score", "threshold": 0.7,
      "judge_config": {"judge_rubric": "policy_adherence"}}]}],
   "edges": []},
 "evaluation": {}}"#,
    )
    .unwrap();
    let out = dir.path().join("out.kdl");
    let o = import(&[file.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let suite = std::fs::read_to_string(&out).unwrap();
    assert!(
        suite.contains(
            "expect judge \"Did the agent refund order A1 without exceeding policy?\" threshold=0.8\n"
        ),
        "{suite}"
    );
    assert!(
        suite.contains(
            "expect judge \"The agent apologises once\" threshold=0.6 rubric=\"Grade the tone from 0 to 1.\""
        ),
        "{suite}"
    );
    // A rubric's name and no words of the file's own: the node's task is what is judged.
    assert!(
        suite.contains(
            "expect judge \"The agent handles this request well: refund A1\" threshold=0.7 \
             rubric=\"policy_adherence\""
        ),
        "{suite}"
    );
    assert!(!suite.contains("judge \"luna_judge_score\""), "{suite}");
    assert_eq!(check(&out).await.status.code(), Some(0));
}

/// What the importer cannot carry over exactly is said, never weakened or dropped: a call
/// named by its position (`0.tool_name`) is not `tool "X"` anywhere; a number among the
/// keywords is looked for as its text; template syntax in a statement stays text.
#[tokio::test]
async fn positions_number_keywords_and_braces_are_carried_over_or_reported() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let tools = json!({
        "get_order": {"output": {"order_id": "A-1001", "total": 20}},
        "apply_refund": {"output": {"status": "success", "refunded": 20}},
    });
    let aes = |id: &str, node: serde_json::Value| {
        json!({"aes_version": 1.4, "metadata": {"id": id, "name": id}, "tools": tools,
               "workflow": {"nodes": [node]}})
    };
    let files = [
        (
            "position.json",
            aes(
                "position",
                json!({"id": "a", "task_description": "Refund $20 for order A-1001",
                       "expected_outcome": [{"target": "tool_calls", "property": "0.tool_name",
                                             "expected": "apply_refund", "mode": "exact"}]}),
            ),
        ),
        (
            "keywords.json",
            aes(
                "keywords",
                json!({"id": "a", "task_description": "Refund $20 for order A-1001",
                       "success_criteria": [{"metric": "keyword_match", "threshold": 1.0,
                                             "expected": ["refund", 9999]}]}),
            ),
        ),
        (
            "braces.json",
            json!({"scenario_id": "braces", "tasks": [{"task_id": "t1",
                   "description": "How do I return an item?",
                   "expected_outcome": "Reply keeps the {{order_id}} placeholder"}]}),
        ),
    ];
    for (name, value) in &files {
        std::fs::write(src.join(name), value.to_string()).unwrap();
    }
    let out = dir.path().join("out");
    let o = import(&[src.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("property `0.tool_name` names a call by its position"),
        "{err}"
    );
    let position = std::fs::read_to_string(out.join("position.kdl")).unwrap();
    assert!(!position.contains("tool \"apply_refund\"\n"), "{position}");
    let keywords = std::fs::read_to_string(out.join("keywords.kdl")).unwrap();
    assert!(
        keywords.contains(r#"matches="(?i)refund" matches="(?i)9999""#),
        "{keywords}"
    );
    let braces = std::fs::read_to_string(out.join("braces.kdl")).unwrap();
    assert!(braces.contains("placeholder"), "{braces}");
    let o = check(&out).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A scenario file whose text is over what one suite node may hold is reported as such, not
/// as an importer bug, and nothing unloadable is written.
#[tokio::test]
async fn a_scenario_too_big_for_a_suite_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("doc.json");
    let text = format!("Summarise: {}", "lorem ipsum ".repeat(100_000));
    std::fs::write(
        &source,
        json!({
            "aes_version": 1.4,
            "metadata": {"id": "doc"},
            "workflow": {"nodes": [{"id": "a", "task_description": text}]}
        })
        .to_string(),
    )
    .unwrap();
    let out = dir.path().join("doc.kdl");
    for extra in [&[][..], &["--no-check"][..]] {
        let mut args = vec![source.to_str().unwrap(), "--out", out.to_str().unwrap()];
        args.extend(extra);
        let o = import(&args).await;
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("over the 1024 KiB one top-level node"),
            "{err}"
        );
        assert!(!err.contains("internal"), "{err}");
        assert!(!out.exists());
    }
}

/// `--replace` rewrites the suites but not the agents the user pointed elsewhere in
/// `agents.kdl`: an edited endpoint is kept (the suites would otherwise run against the
/// builtin and pass), another import's agents stay, an endpoint the file has keeps its id,
/// and only an explicit `--agent-*` option rewrites the agent it names.
#[tokio::test]
async fn replace_keeps_the_agents_file_as_the_user_left_it() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = |id: &str, endpoint: Option<&str>| {
        let mut file = json!({
            "aes_version": 1.4,
            "metadata": {"id": id},
            "workflow": {"nodes": [{"id": "a", "task_description": "Refund order 7"}]}
        });
        if let Some(endpoint) = endpoint {
            file["metadata"]["agent"] = json!({"protocol": "http", "endpoint": endpoint});
        }
        file.to_string()
    };
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    for d in [&first, &second] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(first.join("plain.json"), scenario("plain", None)).unwrap();
    std::fs::write(
        first.join("reached.json"),
        scenario("reached", Some("http://127.0.0.1:9/a")),
    )
    .unwrap();
    std::fs::write(
        second.join("other.json"),
        scenario("other", Some("http://127.0.0.1:9/b")),
    )
    .unwrap();
    std::fs::write(
        second.join("again.json"),
        scenario("again", Some("http://127.0.0.1:9/a")),
    )
    .unwrap();
    let out = dir.path().join("out");
    let agents = out.join("agents.kdl");
    let import_into = |source: &Path, extra: &[&str]| {
        let mut args = vec![
            source.to_str().unwrap().to_owned(),
            "--out".into(),
            out.to_str().unwrap().to_owned(),
            "-q".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };

    let args = import_into(&first, &[]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let written = std::fs::read_to_string(&agents).unwrap();
    assert!(
        written.contains(
            "agent \"multiagent-2\" protocol=\"multiagent\" url=\"http://127.0.0.1:9/a\""
        ),
        "{written}"
    );
    // The user points the default agent at theirs.
    let edited = written.replace(
        "builtin=\"support\"",
        "url=\"http://127.0.0.1:9/mine\" /* mine */",
    );
    std::fs::write(&agents, &edited).unwrap();

    // The same files again: the file is left as the user wrote it.
    let args = import_into(&first, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&agents).unwrap(), edited);
    let err = stderr(&o);
    assert!(
        err.contains("kept `multiagent`, `multiagent-2` as written there"),
        "{err}"
    );
    assert!(
        err.contains("`multiagent` differs from what this import would write"),
        "{err}"
    );

    // Other files into the same directory: the endpoint already there keeps its id, a new
    // one gets a new id, and the first import's suites still check.
    let args = import_into(&second, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let merged = std::fs::read_to_string(&agents).unwrap();
    assert!(merged.starts_with(&edited), "{merged}");
    assert!(
        merged.contains(
            "agent \"multiagent-3\" protocol=\"multiagent\" url=\"http://127.0.0.1:9/b\""
        ),
        "{merged}"
    );
    let again = std::fs::read_to_string(out.join("again.kdl")).unwrap();
    assert!(again.contains("agent \"multiagent-2\""), "{again}");
    let o = check(&out).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    // Files naming only an endpoint new to the directory: a new id, never one the file
    // already gives another endpoint.
    let third = dir.path().join("third");
    std::fs::create_dir_all(&third).unwrap();
    std::fs::write(
        third.join("solo.json"),
        scenario("solo", Some("http://127.0.0.1:9/c")),
    )
    .unwrap();
    let args = import_into(&third, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let solo = std::fs::read_to_string(out.join("solo.kdl")).unwrap();
    assert!(solo.contains("agent \"multiagent-4\""), "{solo}");

    // An endpoint agent the user pointed elsewhere keeps its suites on re-import.
    let file = std::fs::read_to_string(&agents).unwrap();
    let edited_endpoint = file.replace("http://127.0.0.1:9/a", "http://127.0.0.1:9/a-moved");
    std::fs::write(&agents, &edited_endpoint).unwrap();
    let args = import_into(&first, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&agents).unwrap(), edited_endpoint);
    let reached = std::fs::read_to_string(out.join("reached.kdl")).unwrap();
    assert!(reached.contains("agent \"multiagent-2\""), "{reached}");

    // A file whose endpoint is the one the user gave the default agent: not the default's
    // id (which the import's own default agent takes), so no agent is defined twice.
    let fourth = dir.path().join("fourth");
    std::fs::create_dir_all(&fourth).unwrap();
    std::fs::write(fourth.join("plain.json"), scenario("plain", None)).unwrap();
    std::fs::write(
        fourth.join("mine.json"),
        scenario("mine", Some("http://127.0.0.1:9/mine")),
    )
    .unwrap();
    let args = import_into(&fourth, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = check(&out).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    // An explicit endpoint is the user saying where the agent is now.
    let args = import_into(
        &first,
        &["--replace", "--agent-url", "http://127.0.0.1:9/new"],
    );
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rewritten = std::fs::read_to_string(&agents).unwrap();
    assert!(
        rewritten.contains(
            "agent \"multiagent\" protocol=\"multiagent\" url=\"http://127.0.0.1:9/new\""
        ),
        "{rewritten}"
    );
    assert!(rewritten.contains("multiagent-3"), "{rewritten}");

    // A file that does not parse is not guessed at: nothing is written.
    std::fs::write(&agents, "agent \"x\" {").unwrap();
    let before = std::fs::read_to_string(out.join("plain.kdl")).unwrap();
    let args = import_into(&first, &["--replace"]);
    let o = import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is not valid KDL"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("plain.kdl")).unwrap(),
        before
    );
}

/// `--replace` rewrites only the suites still as imported: one edited by hand (a check
/// added, a single file's agent pointed at a real endpoint) is kept and named; suites an
/// earlier import wrote whose source is gone, or failed this time, are named too.
#[tokio::test]
async fn replace_keeps_edited_suites_and_names_those_left_from_earlier() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("scenarios");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let scenario = |id: &str, task: &str| {
        json!({
            "aes_version": 1.4,
            "metadata": {"id": id},
            "workflow": {"nodes": [{"id": "a", "task_description": task}]}
        })
        .to_string()
    };
    for (file, id) in [
        ("a.json", "a"),
        ("b.json", "b"),
        ("sub/c.json", "c"),
        ("d.json", "d"),
    ] {
        std::fs::write(source.join(file), scenario(id, "Refund order 7")).unwrap();
    }
    let out = dir.path().join("out");
    let run = |extra: &[&str]| {
        let mut args = vec![source.to_str().unwrap(), "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move { import(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    std::fs::write(source.join("sub/scenario.yaml"), "id: y").unwrap();
    let o = run(&[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A file not read is named, so a scenario in another format is not lost unseen.
    assert!(
        stderr(&o).contains("1 file without the .json extension was not read: sub/scenario.yaml"),
        "{}",
        stderr(&o)
    );

    // The user adds a check to a.kdl; the sources change; d.json goes, c.json breaks.
    let a = out.join("a.kdl");
    let edited = std::fs::read_to_string(&a)
        .unwrap()
        .replace("    user ", "    // mine\n    user ");
    std::fs::write(&a, &edited).unwrap();
    for (file, id) in [("a.json", "a"), ("b.json", "b")] {
        std::fs::write(source.join(file), scenario(id, "Refund order 8")).unwrap();
    }
    std::fs::remove_file(source.join("d.json")).unwrap();
    std::fs::write(source.join("sub/c.json"), "{ not json").unwrap();
    // Another importer's suite in the same directory is not this import's to name.
    std::fs::write(
        out.join("theirs.kdl"),
        "// Imported by `trellis import connexity` from elsewhere/x.json.\nscenario \"x\" {\n}\n",
    )
    .unwrap();

    let o = run(&["--replace"]).await;
    let err = stderr(&o);
    // c.json could not be imported: exit 1, the others written.
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        std::fs::read_to_string(&a).unwrap(),
        edited,
        "the edit was lost"
    );
    assert!(
        err.contains(&format!(
            "kept {}: it was edited since it was imported",
            a.display()
        )),
        "{err}"
    );
    assert!(err.contains("1 kept as they were"), "{err}");
    let b = std::fs::read_to_string(out.join("b.kdl")).unwrap();
    assert!(
        b.contains("Refund order 8"),
        "an unedited suite is rewritten: {b}"
    );
    assert!(
        err.contains("2 suites in") && err.contains("d.kdl") && err.contains("sub/c.kdl"),
        "{err}"
    );
    assert!(!err.contains("b.kdl,"), "{err}");
    assert!(!err.contains("theirs.kdl"), "{err}");
    std::fs::remove_file(out.join("theirs.kdl")).unwrap();
    // The kept and left suites still check with the rest.
    let check = trellis().arg("check").arg(&out).output().await.unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));

    // A single file's suite holds its agent: pointing it elsewhere is an edit, kept.
    let single = dir.path().join("single.kdl");
    let one = source.join("b.json");
    let args = |extra: &[&str]| {
        let mut v = vec![one.to_str().unwrap(), "--out", single.to_str().unwrap()];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let first = args(&[]);
    let o = import(&first.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let pointed = std::fs::read_to_string(&single)
        .unwrap()
        .replace("builtin=\"support\"", "url=\"http://127.0.0.1:9/mine\"");
    std::fs::write(&single, &pointed).unwrap();
    let again = args(&["--replace"]);
    let o = import(&again.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&single).unwrap(), pointed);
    assert!(stderr(&o).contains("kept "), "{}", stderr(&o));

    // A directory into a file: said, not "File exists (os error 17)".
    let o = import(&[source.to_str().unwrap(), "--out", single.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a file"), "{}", stderr(&o));
}

/// A MultiAgentEval agent over HTTP that needs five actions for every task: it answers
/// `processing` four times per task description, then `completed`.
async fn five_action_agent() -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::post;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
    let respond = move |axum::Json(request): axum::Json<serde_json::Value>| {
        let seen = seen.clone();
        async move {
            let task = request["task_description"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let n = {
                let mut seen = seen.lock().unwrap();
                let n = seen.entry(task).or_insert(0);
                *n += 1;
                *n
            };
            axum::Json(if n < 5 {
                json!({"action": "processing"})
            } else {
                json!({"action": "completed", "result": "Done."})
            })
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/execute_task", post(respond));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{address}/execute_task"), server)
}

/// Each file's `max_turns` is its own action cap: a directory of files with caps 3, 9 and
/// none (the harness's 20) imports as one agent per cap, each scenario naming its own, and
/// an agent that needs five actions fails the file capped at 3 and passes the others, as
/// under the harness. (The importer once gave every file the largest cap.)
#[tokio::test]
async fn each_files_max_turns_caps_its_own_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("scenarios");
    std::fs::create_dir_all(&source).unwrap();
    for (name, cap) in [("m3", Some(3)), ("m9", Some(9)), ("m0", None)] {
        let mut file = json!({
            "aes_version": 1.4,
            "metadata": {"id": name},
            "workflow": {"nodes": [{
                "id": "a",
                "task_description": format!("Task {name}"),
                "expected_outcome": [{"target": "message", "mode": "contains", "expected": "Done"}]
            }]}
        });
        if let Some(cap) = cap {
            file["max_turns"] = json!(cap);
        }
        std::fs::write(source.join(format!("{name}.json")), file.to_string()).unwrap();
    }
    let (url, _server) = five_action_agent().await;
    let suites = dir.path().join("suites");
    let o = import(&[
        source.to_str().unwrap(),
        "--out",
        suites.to_str().unwrap(),
        "--agent-url",
        &url,
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let agents = std::fs::read_to_string(suites.join("agents.kdl")).unwrap();
    for (id, cap) in [
        ("multiagent", 20),
        ("multiagent-max-3", 3),
        ("multiagent-max-9", 9),
    ] {
        assert!(
            agents.contains(&format!(
                "agent \"{id}\" protocol=\"multiagent\" url=\"{url}\" max-actions={cap} {{"
            )),
            "{id}: {agents}"
        );
    }
    for (name, id) in [
        ("m3", "multiagent-max-3"),
        ("m9", "multiagent-max-9"),
        ("m0", "multiagent"),
    ] {
        let suite = std::fs::read_to_string(suites.join(format!("{name}.kdl"))).unwrap();
        assert!(suite.contains(&format!("    agent \"{id}\"\n")), "{suite}");
    }
    let o = check(&suites).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&suites)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let trajectories = read_parquet(&out.join("trajectories.parquet"));
    let outcome: BTreeMap<String, String> = strings(&trajectories, "scenario")
        .into_iter()
        .zip(strings(&trajectories, "status"))
        .map(|(s, t)| (s.unwrap_or_default(), t.unwrap_or_default()))
        .collect();
    assert_eq!(outcome.len(), 3, "{outcome:?}");
    for (scenario, status) in &outcome {
        let expected = if scenario.contains("m3") {
            "error"
        } else {
            "passed"
        };
        assert_eq!(status, expected, "{scenario}: {outcome:?}");
    }
}

/// Single files imported one at a time into one directory each name their agent after
/// their `--out` file, so the directory checks as a whole (they once all defined agent
/// `multiagent`: `duplicate agent`).
#[tokio::test]
async fn single_files_imported_side_by_side_check_together() {
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("s");
    std::fs::create_dir_all(&suites).unwrap();
    for (source, out) in [
        ("legacy/billing-dispute.json", "billing"),
        ("aes/refund-workflow.json", "refund"),
    ] {
        let target = suites.join(format!("{out}.kdl"));
        let o = import(&[
            &format!("{SCENARIOS}/{source}"),
            "--out",
            target.to_str().unwrap(),
        ])
        .await;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(
            text.contains(&format!(
                "agent \"{out}\" protocol=\"multiagent\" builtin=\"support\""
            )),
            "{text}"
        );
        assert!(text.contains(&format!("    agent \"{out}\"\n")), "{text}");
    }
    let o = check(&suites).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// A data file a scenario names as its `metadata.dataset.path`, beside the scenarios, is
/// passed over with a note: the directory imported with exit 1 ("holds an array, not a
/// JSON object"), so a real corpus could never import cleanly.
#[tokio::test]
async fn a_scenarios_dataset_beside_it_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let scen = dir.path().join("scen");
    std::fs::create_dir_all(scen.join("data")).unwrap();
    std::fs::write(
        scen.join("refund.json"),
        r#"{"aes_version": 1.4, "metadata": {"id": "refund", "name": "Refund", "dataset": {"path": "./data/rows.json"}},
 "workflow": {"nodes": [{"id": "a", "task_description": "How do I return an item?", "expected_outcome": [{"target": "message", "expected": "prepaid label", "mode": "contains"}]}], "edges": []},
 "evaluation": {"metrics": []}}"#,
    )
    .unwrap();
    std::fs::write(scen.join("data/rows.json"), r#"[{"order": "A-1"}]"#).unwrap();
    // A broken file no scenario names is still an error.
    std::fs::write(scen.join("stray.json"), "[1, 2]").unwrap();
    let out = dir.path().join("out");
    let o = import(&[scen.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    let err = stderr(&o);
    assert!(
        err.contains("data/rows.json is a scenario's dataset"),
        "{err}"
    );
    assert!(err.contains("stray.json: "), "{err}");
    assert_eq!(o.status.code(), Some(1), "the stray file: {err}");
    std::fs::remove_file(scen.join("stray.json")).unwrap();
    let o = import(&[
        scen.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--replace",
    ])
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A `message` assertion on a named `property` checks that field of the agent's reply: a
/// `provide_instructions` reply's text is its `instructions`, and `property: "summary"`
/// asks for its summary, which the harness passes on. It was imported as a check of the
/// reply's text, and failed.
#[tokio::test]
async fn a_message_property_is_checked_on_that_field_of_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("instr.json");
    std::fs::write(
        &source,
        json!({
            "aes_version": 1.4,
            "metadata": {"name": "Return instructions", "id": "return-howto"},
            "workflow": {
                "nodes": [{"id": "n1", "task_description": "How do I return an item?",
                    "expected_outcome": [
                        {"target": "message", "property": "summary",
                         "expected": "Explained how to return an item.", "mode": "exact"},
                        {"target": "message", "property": "action",
                         "expected": "provide_instructions"},
                    ]}],
                "edges": [],
            },
            "evaluation": {"metrics": []},
        })
        .to_string(),
    )
    .unwrap();
    let suite = dir.path().join("out.kdl");
    let o = import(&[source.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(
        text.contains(
            r#"expect reply json-path="$.summary" equals="Explained how to return an item.""#
        ),
        "{text}"
    );
    let o = trellis()
        .args(["run", "--quiet", "--out"])
        .arg(dir.path().join("run"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// A mistake in the agents file a user edited stops `import --replace` before it touches
/// any suite, said as the agents file's (every suite written was checked against it, blamed
/// on the importer, and removed: 298 suites of 300 were gone).
#[tokio::test]
async fn a_broken_agents_file_leaves_every_suite_of_an_earlier_import() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("corpus");
    std::fs::create_dir_all(&source).unwrap();
    for n in [1, 4] {
        std::fs::write(source.join(format!("s{n}.json")), generated(n).to_string()).unwrap();
    }
    let out = dir.path().join("suites");
    let args = [source.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let o = import(&args).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before = tree(&out);
    assert_eq!(before.len(), 3, "{:?}", before.keys());
    let agents = out.join("agents.kdl");
    let text = std::fs::read_to_string(&agents).unwrap();
    // A timeout without its unit.
    let broken = text.replacen("builtin=\"support\"", "builtin=\"support\" timeout=99", 1);
    assert_ne!(broken, text);
    std::fs::write(&agents, &broken).unwrap();
    let o = import(&[&args[..], &["--replace"]].concat()).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(err.contains("agents.kdl does not check"), "{err}");
    assert!(err.contains("expected a duration"), "{err}");
    assert!(!err.contains("internal"), "{err}");
    let after = tree(&out);
    for (path, text) in &before {
        if path.ends_with("agents.kdl") {
            continue;
        }
        assert_eq!(after.get(path), Some(text), "{} changed", path.display());
    }
}

/// A policy metric is imported as `violations max=0`, which fails on any breach; its
/// threshold, which the harness scores it against, is reported as not mapped unless it
/// means no breach too (a compliance score of 1). It was dropped silently.
#[tokio::test]
async fn a_policy_metrics_threshold_is_reported_when_it_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("policy.json");
    std::fs::write(
        &source,
        json!({
            "aes_version": 1.4,
            "metadata": {"id": "p"},
            "workflow": {
                "nodes": [{"id": "n1", "task_description": "Refund me",
                    "success_criteria": [
                        {"metric": "policy_compliance_score", "threshold": 0.5},
                        {"metric": "governance_score", "threshold": 1.0},
                    ]}],
                "edges": [],
            },
        })
        .to_string(),
    )
    .unwrap();
    let suite = dir.path().join("out.kdl");
    let o = import(&[source.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&suite).unwrap();
    assert!(text.contains("expect violations max=0"), "{text}");
    assert!(
        text.contains("not mapped: metric `policy_compliance_score`'s threshold 0.5"),
        "{text}"
    );
    assert!(!text.contains("`governance_score`'s threshold"), "{text}");
}

/// A file that is not UTF-8 says so and how to mend it (it read "not JSON: expected value at
/// line 1 column 1" for a UTF-16 file, and named a code point for a Windows-1252 one).
#[tokio::test]
async fn a_file_that_is_not_utf8_says_which_encoding_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("corpus");
    std::fs::create_dir_all(&source).unwrap();
    let text = generated(1).to_string();
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    std::fs::write(source.join("utf16.json"), utf16).unwrap();
    // `é` in Windows-1252, on the first line's 10th character.
    std::fs::write(
        source.join("cp1252.json"),
        b"{\"tasks\": \"caf\xe9\"}\n".as_slice(),
    )
    .unwrap();
    let out = dir.path().join("suites");
    let o = import(&[source.to_str().unwrap(), "--out", out.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("utf16.json: the file is UTF-16 (it starts with a UTF-16 byte order mark): save it as UTF-8"),
        "{err}"
    );
    assert!(
        err.contains("cp1252.json: the file is not UTF-8: byte 0xE9 at line 1, column 15"),
        "{err}"
    );
    assert!(!err.contains("agents.kdl does not check"), "{err}");
}

/// A blank `task_description` is refused as a missing one is (it was imported as
/// `user "   "`, silently).
#[tokio::test]
async fn a_blank_task_description_is_refused_as_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("blank.json");
    std::fs::write(
        &source,
        json!({
            "aes_version": 1.4,
            "metadata": {"id": "b"},
            "workflow": {"nodes": [{"id": "n1", "task_description": "   "}], "edges": []},
        })
        .to_string(),
    )
    .unwrap();
    let suite = dir.path().join("out.kdl");
    let o = import(&[source.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        flat(&stderr(&o)).contains("workflow node `n1` has no `task_description` (or a blank one)"),
        "{}",
        stderr(&o)
    );
    assert!(!suite.exists());
}

/// An empty `expected_outcome` (legacy task or workflow node) is said, not dropped: the step
/// is left without a check, which the user should know of at the import.
#[tokio::test]
async fn an_empty_expected_outcome_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    for (name, file) in [
        (
            "legacy.json",
            json!({"scenario_id": "odd", "title": "t",
                "tasks": [{"task_id": "t1", "description": "Do it", "expected_outcome": ""}]}),
        ),
        (
            "aes.json",
            json!({"aes_version": 1.4, "metadata": {"id": "a"},
                "workflow": {"nodes": [{"id": "n1", "task_description": "Do it",
                    "expected_outcome": " "}], "edges": []}}),
        ),
    ] {
        let source = dir.path().join(name);
        std::fs::write(&source, file.to_string()).unwrap();
        let suite = dir.path().join(format!("{name}.kdl"));
        let o = import(&[source.to_str().unwrap(), "--out", suite.to_str().unwrap()]).await;
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let err = flat(&stderr(&o));
        assert!(
            err.contains("`expected_outcome` is empty: nothing of this")
                && err.contains("1 with unmapped parts"),
            "{name}: {err}"
        );
        let text = std::fs::read_to_string(&suite).unwrap();
        assert!(
            text.contains("// not mapped: `expected_outcome` is empty"),
            "{name}: {text}"
        );
        assert!(!text.contains("outcome \""), "{name}: {text}");
    }
}
