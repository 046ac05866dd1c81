//! `trellis run` on the example suites, and the other read-only commands.

use super::*;

#[tokio::test]
async fn the_example_suites_run_offline_and_write_every_table() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    // One branch of the booking example fails on purpose.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("book-duct-cleaning"), "{text}");
    assert!(text.contains("no call to `create_booking`"), "{text}");

    let t = read_parquet(&out.path().join("trajectories.parquet"));
    for column in [
        "run_id",
        "suite",
        "scenario",
        "trajectory",
        "agent",
        "protocol",
        "repetition",
        "status",
        "passed",
        "turns",
        "duration_ms",
        "fault_category",
    ] {
        assert!(t.column(column).is_ok(), "trajectories has no {column}");
    }
    // book-duct-cleaning: 2 trajectories × 3 repetitions; price-first 1; book-and-cancel 2;
    // prompt-injection 1; out-of-area 2; fixie: genrand-is-repeatable 1, add-chain 2;
    // agentscope: weather-tool-call 2, weather-without-stream 1, severe-weather 1;
    // multiagent: 7 per agent (complaint forks into 2 by the agent's branch action,
    // credit-limit into 2) × 4 agents (the same agent over http, process, tcp, unix); a2a:
    // book-a-flight 2 × 2 agents, streamed-answer 1; langserve: weather-tool-call 2 per agent
    // × 2, streamed-answer 1; opentelemetry: weather-and-refund 1. The draft scenarios do
    // not run by default.
    assert_eq!(t.height(), 19 + 28 + 5 + 5 + 1);
    let failed: Vec<(String, String)> = strings(&t, "status")
        .into_iter()
        .zip(strings(&t, "trajectory"))
        .zip(strings(&t, "scenario"))
        .filter(|((s, _), _)| s.as_deref() == Some("failed"))
        .map(|((_, tr), sc)| (sc.unwrap(), tr.unwrap()))
        .collect();
    assert_eq!(failed.len(), 3);
    assert!(
        failed
            .iter()
            .all(|(sc, tr)| sc == "book-duct-cleaning" && tr == "asks-price")
    );

    // The shared prefix of book-duct-cleaning ran once per repetition: 2 turns × 3.
    let turns = read_parquet(&out.path().join("turns.parquet"));
    let start_turns = strings(&turns, "scenario")
        .into_iter()
        .zip(strings(&turns, "node"))
        .filter(|(s, n)| {
            s.as_deref() == Some("book-duct-cleaning") && n.as_deref() == Some("start")
        })
        .count();
    assert_eq!(start_turns, 6);
    // 30 booking and guardrails turns; fixie: 3 genrand calls, and add-chain's first call
    // once (forks copy a Fixie session) plus one per branch; agentscope: 4 + 3 (2 of them
    // replayed in a fresh session) + 1 + 1; multiagent: 12 per agent (1 + 1 + 4, then
    // credit-limit's pause once and one answer per branch, complaint's branch action once
    // and one continuation per option) × 4; a2a: book-a-flight 3 + 1 + 1 + 3 replayed per
    // agent × 2, streamed-answer 2; langserve: 4 per agent (the prefix once, forks copy the
    // history) × 2, and 1; opentelemetry: 2.
    assert_eq!(turns.height(), 45 + 48 + 18 + 9 + 2);

    let calls = read_parquet(&out.path().join("tool_calls.parquet"));
    assert!(strings(&calls, "name").contains(&Some("create_booking".to_string())));
    let criteria = read_parquet(&out.path().join("criteria.parquet"));
    let trajectory_level = criteria.column("turn_index").unwrap().null_count();
    assert!(trajectory_level > 0 && trajectory_level < criteria.height());
    let skipped: Vec<Option<String>> = strings(&criteria, "kind")
        .into_iter()
        .zip(strings(&criteria, "status"))
        .filter(|(k, _)| k.as_deref() == Some("judge") || k.as_deref() == Some("outcome"))
        .map(|(_, s)| s)
        .collect();
    assert!(!skipped.is_empty());
    assert!(skipped.iter().all(|s| s.as_deref() == Some("skipped")));

    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains("asks-price"));
    // Who the user is and what the run captured come from the journal into the report.
    assert!(html.contains("<code>polite-customer</code>"));
    assert!(html.contains("preferred_day</span> Tuesday"));
    assert!(html.contains("<dt>quote</dt><dd><code>249</code></dd>"));
    assert!(
        !html.contains("src=\"http"),
        "report.html must be self-contained"
    );
    let junit = std::fs::read_to_string(out.path().join("junit.xml")).unwrap();
    assert!(junit.contains("<testsuites"));
    assert!(out.path().join(crate::JOURNAL).exists());
}

/// The tables read with pyarrow, where pandas reads Parquet through: text columns are
/// `large_string` (polars' in-memory `string_view` is neither convertible to pandas inside a
/// list nor taken by pyarrow's compute functions), and filtering and sorting on them work.
#[tokio::test]
async fn the_tables_read_with_pyarrow_as_plain_text_columns() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let script = r#"
import glob, os, sys
import pyarrow.compute as pc, pyarrow.parquet as pq
tables = sorted(glob.glob(os.path.join(sys.argv[1], "*.parquet")))
assert len(tables) == 7, tables
for path in tables:
    schema = pq.read_schema(path)
    views = [f"{f.name}: {f.type}" for f in schema if "view" in str(f.type)]
    assert not views, (path, views)
t = pq.read_table(os.path.join(sys.argv[1], "trajectories.parquet"))
assert str(t.schema.field("nodes").type) == "large_list<element: large_string>", t.schema
failed = t.filter(pc.equal(t["status"], "failed"))
assert failed.num_rows >= 1, failed.num_rows
assert t.sort_by("scenario").num_rows == t.num_rows
turns = pq.read_table(os.path.join(sys.argv[1], "turns.parquet"), filters=[("agent", "=", "demo")])
assert turns.num_rows >= 1
print("ok", t.num_rows, failed.num_rows)
"#;
    let py = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(out.path())
        .output()
        .expect("python3 runs (with pyarrow: `pip install pyarrow`)");
    assert!(
        py.status.success(),
        "pyarrow could not use the tables (`pip install pyarrow`): {}",
        String::from_utf8_lossy(&py.stderr)
    );
}

/// A scenario skipped for a need of another suite names it as its `needs` is written,
/// `SUITE/ID`: two suites may each have a `login`, and the bare id named the wrong one.
#[tokio::test]
async fn a_need_of_another_suite_is_named_with_its_suite_in_the_skip_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.kdl"),
        r#"agent "demo" protocol="connexity" builtin="booking"
scenario "login" {
    user "Hi"
    expect reply contains="this will fail"
}
scenario "wip" {
    status "draft"
    user "Hi"
}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("flows.kdl"),
        r#"scenario "login" {
    user "Hi"
    expect no-error
}
scenario "order" {
    needs "base/login" "login"
    user "Hi"
    expect no-error
}
scenario "draft-user" {
    needs "base/wip"
    user "Hi"
    expect no-error
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&out.join("trajectories.parquet"));
    let reasons: Vec<(Option<String>, Option<String>)> = strings(&t, "scenario")
        .into_iter()
        .zip(strings(&t, "skip_reason"))
        .collect();
    let reason = |scenario: &str| {
        reasons
            .iter()
            .find(|(s, _)| s.as_deref() == Some(scenario))
            .and_then(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        reason("order"),
        "needs `base/login`, which did not pass",
        "{reasons:?}"
    );
    assert!(
        reason("draft-user").starts_with("needs `base/wip`, which is a draft"),
        "{reasons:?}"
    );
}

/// A draft stays out of a run even when an active scenario needs it: the scenario that
/// needs it is skipped, saying so, and a selection that matches only drafts names them.
#[tokio::test]
async fn a_needed_draft_does_not_run_and_its_dependent_is_skipped_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("drafts.kdl"),
        r#"agent "demo" protocol="connexity" builtin="booking"
scenario "wip" {
    status "draft"
    user "Hi"
    expect reply contains="this will fail"
}
scenario "main" {
    needs "wip"
    user "Hi"
    expect no-error
}
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let t = read_parquet(&out.join("trajectories.parquet"));
    assert_eq!(strings(&t, "scenario"), vec![Some("main".to_string())]);
    assert_eq!(strings(&t, "status"), vec![Some("skipped".to_string())]);
    let reason = strings(&t, "skip_reason").remove(0).unwrap_or_default();
    assert!(
        reason.contains("needs `wip`, which is a draft") && reason.contains("--include-inactive"),
        "{reason}"
    );

    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .args(["--filter", "wip", "--out"])
        .arg(dir.path().join("wip"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let said = stderr(&o);
    assert!(said.contains("`drafts/wip` is a draft"), "{said}");

    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .args(["--include-inactive", "--out"])
        .arg(dir.path().join("all"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "the draft runs, and fails");

    // The needs graph shows the draft the selection needs, and that it does not run.
    let o = trellis()
        .args(["graph", "--needs"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let dot = stdout(&o);
    assert!(dot.contains("wip (a draft, not run)"), "{dot}");
    assert_eq!(dot.matches(" -> ").count(), 1, "{dot}");
}

/// Under a hard limit on open files too low for `--jobs`, the run lowers `--jobs` to what
/// fits and says so: past the limit, connections failed with "Too many open files", recorded
/// as the agents' faults.
#[tokio::test]
async fn jobs_beyond_the_open_file_limit_are_lowered_and_said() {
    let out = tempfile::tempdir().unwrap();
    let o = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 96 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_trellis"))
        .args(["run", "suites/booking.kdl", "--jobs", "500", "--out"])
        .arg(out.path().join("run"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .await
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("--jobs 500 lowered to "), "{err}");
    // The example's failure on purpose; no fault of a connection.
    assert_eq!(o.status.code(), Some(1), "{err}");
    let t = read_parquet(&out.path().join("run").join("trajectories.parquet"));
    assert!(strings(&t, "fault_category").iter().all(Option::is_none));

    // Every example suite, with its many builtin agents: each keeps idle connections, both
    // of whose ends are this process's. They were counted as one call's connection, and a
    // quarter of the run failed with "Too many open files" as the agents' faults, junit.xml
    // lost with them.
    let o = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 160 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_trellis"))
        .args(["run", "suites", "-q", "--out"])
        .arg(out.path().join("all"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .await
        .unwrap();
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(said.contains("--jobs 32 lowered to "), "{said}");
    assert!(!said.contains("Too many open files"), "{said}");
    assert!(out.path().join("all/junit.xml").is_file(), "{said}");
    let t = read_parquet(&out.path().join("all").join("trajectories.parquet"));
    let faults: Vec<Option<String>> = strings(&t, "fault_category")
        .into_iter()
        .filter(|f| matches!(f.as_deref(), Some("connect" | "setup")))
        .collect();
    assert!(faults.is_empty(), "{faults:?}");
}

#[tokio::test]
async fn filter_and_tag_select_scenarios() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args([
            "run",
            "suites/",
            "--filter",
            "guardrails/*",
            "--tag",
            "edge-case",
            "--out",
        ])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let t = read_parquet(&out.path().join("trajectories.parquet"));
    let scenarios = strings(&t, "scenario");
    assert_eq!(scenarios.len(), 2);
    assert!(
        scenarios
            .iter()
            .all(|s| s.as_deref() == Some("out-of-area"))
    );
}

#[tokio::test]
async fn list_and_graph_describe_the_trajectories() {
    let o = trellis().args(["list", "suites/"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("booking/book-duct-cleaning"));
    assert!(
        text.contains("asks-price  (start > asks-price > asks-price/then)"),
        "{text}"
    );

    let o = trellis()
        .args(["graph", "suites/booking.kdl", "--format", "mermaid"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("flowchart TD"));

    let o = trellis()
        .args(["graph", "suites/", "--needs"])
        .output()
        .await
        .unwrap();
    let dot = stdout(&o);
    assert!(dot.starts_with("digraph needs"), "{dot}");
    assert_eq!(
        dot.matches(" -> ").count(),
        1,
        "book-and-cancel needs price-first"
    );
    // The selection applies, with what it needs pulled in as a run would.
    let o = trellis()
        .args(["graph", "suites/", "--needs", "--filter", "book-and-cancel"])
        .output()
        .await
        .unwrap();
    let dot = stdout(&o);
    assert_eq!(dot.matches("[label=").count(), 2, "{dot}");
    assert!(dot.contains("booking/price-first"), "{dot}");
    assert_eq!(dot.matches(" -> ").count(), 1, "{dot}");
}

#[tokio::test]
async fn every_command_explains_itself_with_an_example() {
    for command in [
        "run", "check", "list", "graph", "report", "bench", "runs", "compare",
    ] {
        let o = trellis().args([command, "--help"]).output().await.unwrap();
        assert_eq!(o.status.code(), Some(0));
        assert!(
            stdout(&o).contains("Example:"),
            "{command} --help has no example"
        );
    }
}

#[tokio::test]
async fn report_rebuilds_the_results_of_a_killed_run_from_its_journal() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/", "--filter", "price-first", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Simulate a crash: cut the compressed journal inside its last block (the run's end)
    // and drop every derived file.
    let journal = out.path().join(crate::JOURNAL);
    let whole = std::fs::read(&journal).unwrap();
    std::fs::write(&journal, &whole[..whole.len() - 4]).unwrap();
    let derived = [
        "trajectories.parquet",
        "turns.parquet",
        "report.html",
        "junit.xml",
    ];
    for file in derived {
        std::fs::remove_file(out.path().join(file)).unwrap();
    }
    let o = trellis()
        .arg("report")
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("did not finish"), "{}", stdout(&o));
    let t = read_parquet(&out.path().join("trajectories.parquet"));
    assert_eq!(t.height(), 1);
    assert!(out.path().join("report.html").exists());

    // A plain journal of an earlier version, cut inside a line, reads the same way.
    let text = crate::journal_text(out.path());
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("{\"run_finished\""))
        .collect();
    std::fs::remove_file(&journal).unwrap();
    std::fs::write(
        out.path().join("journal.jsonl"),
        format!("{}\n{{\"trajectory\":{{\"sui", kept.join("\n")),
    )
    .unwrap();
    for file in derived {
        std::fs::remove_file(out.path().join(file)).unwrap();
    }
    let o = trellis()
        .arg("report")
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("did not finish"), "{text}");
    assert!(
        text.contains("1 journal line could not be read and was skipped"),
        "{text}"
    );
    let t = read_parquet(&out.path().join("trajectories.parquet"));
    assert_eq!(t.height(), 1);
    assert!(out.path().join("report.html").exists());

    let o = trellis()
        .args(["report", "/nonexistent/run"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// `report` takes a run as `show` and `compare` do: a directory, or an id (a unique prefix)
/// or name in `runs/`.
#[tokio::test]
async fn report_takes_a_run_id_prefix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"Hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let run = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|name| name != "latest")
        .unwrap();
    std::fs::remove_file(dir.path().join("runs").join(&run).join("report.html")).unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["report", &run[..12]])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        dir.path()
            .join("runs")
            .join(&run)
            .join("report.html")
            .is_file()
    );
}

/// `list` says which trajectories will be skipped and on which agent, whatever the reason.
#[tokio::test]
async fn list_names_the_agent_a_trajectory_is_skipped_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mixed.kdl"),
        "agent \"o\" protocol=\"fixie\" url=\"http://127.0.0.1:1/\"\n\
         agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    agents \"o\" \"c\"\n    user \"hi\"\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("list")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("skipped on `o`: ") && out.contains("`fixie`"),
        "{out}"
    );
    assert!(!out.contains("skipped on `c`"), "{out}");

    // A Fixie agent's own provider plays its LLM, however many providers the project has.
    std::fs::write(
        dir.path().join("mixed.kdl"),
        "provider \"llm\" kind=\"openai\" base-url=\"http://127.0.0.1:1/v1\" model=\"m\"\n\
         provider \"other\" kind=\"openai\" base-url=\"http://127.0.0.1:1/v1\" model=\"m\"\n\
         agent \"o\" protocol=\"fixie\" url=\"http://127.0.0.1:1/\" provider=\"llm\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    for command in ["list", "check"] {
        let o = trellis()
            .arg(command)
            .arg(dir.path())
            .output()
            .await
            .unwrap();
        let said = format!("{}{}", stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(0), "{command}: {said}");
        assert!(!said.contains("skipped"), "{command}: {said}");
    }
}

#[tokio::test]
async fn tool_calls_made_in_a_replayed_prefix_are_marked_as_replays() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/agentscope.kdl", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    // `severe-weather` fails on purpose.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let calls = read_parquet(&out.path().join("tool_calls.parquet"));
    let replay: Vec<Option<bool>> = calls
        .column("replay")
        .unwrap()
        .bool()
        .unwrap()
        .iter()
        .collect();
    let arguments = strings(&calls, "arguments");
    // Paris in the shared prefix, Tokyo in `second-city`, Berlin without streaming: the
    // calls the suite asked for, each once; `recall` replays Paris in its own session.
    let asked: Vec<&Option<String>> = arguments
        .iter()
        .zip(&replay)
        .filter(|(_, r)| **r == Some(false))
        .map(|(a, _)| a)
        .collect();
    assert_eq!(asked.len(), 3, "{calls}");
    let replayed: Vec<&Option<String>> = arguments
        .iter()
        .zip(&replay)
        .filter(|(_, r)| **r == Some(true))
        .map(|(a, _)| a)
        .collect();
    assert_eq!(
        replayed,
        [&Some("{\"city\":\"Paris\"}".to_owned())],
        "{calls}"
    );
}

#[tokio::test]
async fn the_langserve_suite_passes_over_the_http_protocol_and_records_tool_calls() {
    let out = tempfile::tempdir().unwrap();
    let o = trellis()
        .args(["run", "suites/langserve.kdl", "--out"])
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("5 trajectories: 5 passed"),
        "{}",
        stdout(&o)
    );
    let calls = read_parquet(&out.path().join("tool_calls.parquet"));
    let arguments = strings(&calls, "arguments");
    assert!(
        arguments
            .iter()
            .any(|a| a.as_deref() == Some(r#"{"city":"Tokyo"}"#)),
        "{calls}"
    );
    let turns = read_parquet(&out.path().join("turns.parquet"));
    let ttft = turns.column("ttft_ms").unwrap();
    assert!(
        ttft.null_count() < ttft.len(),
        "the streamed turns have a ttft: {turns}"
    );
}

/// The `"trajectory"` entries of a run's journal, by scenario id.
fn journal_trajectories(out: &Path) -> Vec<serde_json::Value> {
    crate::journal_text(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e.get("trajectory").cloned())
        .collect()
}

/// `stop-on-failure #true`: a failed `expect` ends the trajectory before its next step is
/// sent, the checks of the same turn made; at the end of the path, the trajectory ends as
/// any other. Without it every step runs.
#[tokio::test]
async fn stop_on_failure_sends_no_step_after_a_failed_check() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"stops\" {\n    stop-on-failure #true\n    criteria {\n        turns max=9\n    }\n    \
         user \"hi\"\n    expect {\n        reply contains=\"NOT SAID\"\n        no-error\n    }\n    \
         expect reply not-contains=\"ZZZ\"\n    user \"refund me\"\n    expect reply contains=\"AFTER\"\n}\n\
         scenario \"last\" {\n    stop-on-failure #true\n    criteria {\n        turns max=9\n    }\n    \
         user \"hi\"\n    expect reply contains=\"NOT SAID\"\n}\n\
         scenario \"goes-on\" {\n    user \"hi\"\n    expect reply contains=\"NOT SAID\"\n    \
         user \"refund me\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let trajectories = journal_trajectories(&out);
    let of = |id: &str| {
        trajectories
            .iter()
            .find(|t| t["scenario"] == id)
            .unwrap_or_else(|| panic!("no trajectory of `{id}`"))
    };
    let checks = |id: &str| -> Vec<(String, String)> {
        of(id)["criteria"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["criterion"].as_str().unwrap().to_string(),
                    c["status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let status = |id: &str, criterion: &str| {
        checks(id)
            .into_iter()
            .find(|(c, _)| c == criterion)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("{id}: no `{criterion}` in {:?}", checks(id)))
    };
    assert_eq!(of("stops")["status"], "failed");
    assert_eq!(of("stops")["turns"], 1, "{}", of("stops"));
    // The turn's checks are all made; what follows its next step is not.
    assert_eq!(status("stops", "reply contains=\"NOT SAID\""), "failed");
    assert_eq!(status("stops", "no-error"), "passed");
    assert_eq!(status("stops", "reply not-contains=\"ZZZ\""), "passed");
    assert_eq!(status("stops", "reply contains=\"AFTER\""), "skipped");
    assert_eq!(status("stops", "turns max=9"), "skipped");
    // Nothing was left to send: the trajectory's own checks are made.
    assert_eq!(of("last")["status"], "failed");
    assert_eq!(status("last", "turns max=9"), "passed");
    assert_eq!(of("goes-on")["status"], "failed");
    assert_eq!(of("goes-on")["turns"], 2, "{}", of("goes-on"));
}

/// Each failed check the console lists says where it is written (`file:line:column`), told
/// apart by its trajectory's branches and turn when the same check is written twice, and
/// found for every instance of a `for-each` scenario.
#[tokio::test]
async fn a_failed_check_names_the_line_it_is_written_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        r#"agent "c" protocol="connexity" builtin="booking"

scenario "forks" {
    user "Hi!"
    expect reply contains="zebra"
    branch "a" {
        user "again"
        expect reply contains="zebra"
    }
    branch "b" {
        user "other"
        user "more"
        expect {
            no-error
            reply contains="zebra"
        }
    }
    criteria {
        reply contains="never"
    }
}

dataset "rows" path="rows.csv"
scenario "each" for-each="rows" {
    user "{{ row.text }}"
    expect reply contains="giraffe"
}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rows.csv"),
        "text
hello
bye
",
    )
    .unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "--out", "out"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let failure = |header: &str| -> Vec<&str> {
        let at = out
            .find(header)
            .unwrap_or_else(|| panic!("no `{header}` in {out}"));
        out[at..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("    "))
            .filter(|l| l.starts_with("    ✗"))
            .collect()
    };
    assert_eq!(
        failure("FAIL s/forks a [c #0]"),
        [
            "    ✗ turn 0: reply contains=\"zebra\"  (s.kdl:5:12)",
            "    ✗ turn 1: reply contains=\"zebra\"  (s.kdl:8:16)",
            "    ✗ reply contains=\"never\"  (s.kdl:19:9)",
        ],
        "{out}"
    );
    assert_eq!(
        failure("FAIL s/forks b [c #0]"),
        [
            "    ✗ turn 0: reply contains=\"zebra\"  (s.kdl:5:12)",
            "    ✗ turn 2: reply contains=\"zebra\"  (s.kdl:15:13)",
            "    ✗ reply contains=\"never\"  (s.kdl:19:9)",
        ],
        "{out}"
    );
    let instances: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("reply contains=\"giraffe\""))
        .collect();
    assert_eq!(
        instances, ["    ✗ turn 0: reply contains=\"giraffe\"  (s.kdl:26:12)"; 2],
        "{out}"
    );
}

#[tokio::test]
async fn a_scenario_that_checks_nothing_is_skipped_not_passed_and_check_warns() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"unchecked\" {\n    user \"hi\"\n}\n\
         scenario \"fault-free\" {\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "a warning, not an error");
    let err = stderr(&o);
    assert!(err.contains("trellis::no_checks"), "{err}");
    assert!(err.contains("scenario `unchecked` checks nothing"), "{err}");
    assert!(err.contains("s.kdl:2:"), "{err}");
    assert!(!err.contains("`fault-free`"), "{err}");

    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trajectories = journal_trajectories(&out);
    let of = |id: &str| {
        trajectories
            .iter()
            .find(|t| t["scenario"] == id)
            .unwrap_or_else(|| panic!("no trajectory of `{id}`"))
    };
    assert_eq!(of("unchecked")["status"], "skipped");
    assert!(
        of("unchecked")["skip_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("no checks")),
        "{}",
        of("unchecked")
    );
    assert_eq!(of("fault-free")["status"], "passed");

    // A run in which nothing was checked at all says so at its end (its exit code 0
    // means only that nothing failed), and again when it is resumed after it finished.
    let alone = dir.path().join("alone");
    for resume in [false, true] {
        let o = trellis()
            .arg("run")
            .arg(dir.path().join("s.kdl"))
            .args(["--filter", "unchecked"])
            .arg(if resume { "--resume" } else { "--out" })
            .arg(&alone)
            .output()
            .await
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "resume {resume}: {err}");
        assert!(
            crate::flat(&err).contains(
                "warning: nothing was checked: of 1 trajectory, none passed or failed (every \
                 one was skipped, its checks not run; --strict fails such a run)"
            ),
            "resume {resume}: {err}"
        );
    }
    // In a GitHub workflow: an annotation, and a line in the job summary.
    let step_summary = dir.path().join("summary.md");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .args(["--filter", "unchecked", "--out"])
        .arg(dir.path().join("in-actions"))
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &step_summary)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "::warning title=Trellis run checked nothing::none of the run's 1 trajectory \
             passed or failed (1 skipped, 0 invalid)"
        ),
        "{}",
        stdout(&o)
    );
    let summary = std::fs::read_to_string(&step_summary).unwrap();
    assert!(summary.contains("**Nothing was checked:**"), "{summary}");
    // Two such runs compared: the gate does not pass on nothing.
    let o = trellis()
        .arg("compare")
        .arg(&alone)
        .arg(dir.path().join("in-actions"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        crate::flat(&stdout(&o)).contains("all 1 of its trajectories were skipped"),
        "{}",
        stdout(&o)
    );

    // `--strict`: a trajectory that checks nothing is a failure.
    let strict = dir.path().join("strict");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .arg("--strict")
        .arg("--out")
        .arg(&strict)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let trajectories = journal_trajectories(&strict);
    let unchecked = trajectories.iter().find(|t| t["scenario"] == "unchecked");
    assert_eq!(unchecked.unwrap()["status"], "failed");

    // The rule is in the tables, and a comparison across rules says so.
    let strict_column = |dir: &Path| {
        read_parquet(&dir.join("runs.parquet"))
            .column("strict")
            .unwrap()
            .bool()
            .unwrap()
            .get(0)
    };
    assert_eq!(strict_column(&out), Some(false));
    assert_eq!(strict_column(&strict), Some(true));
    let page = dir.path().join("compare.html");
    let o = trellis()
        .arg("compare")
        .arg(&out)
        .arg(&strict)
        .arg("--html")
        .arg(&page)
        .output()
        .await
        .unwrap();
    assert!(
        crate::flat(&stdout(&o)).contains(
            "note: the base run was made without --strict and the head run with --strict"
        ),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("Note: the base run was made without --strict"),
        "the compare page says it too"
    );
}

#[tokio::test]
async fn bench_table_measures_each_figure_on_a_fresh_process() {
    let o = trellis()
        .args(["bench", "--table", "--trajectories", "300", "--suites"])
        .arg(repo("suites"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    for figure in [
        r"300 one-turn trajectories, c=256: turns/s",
        r"journal ÷ Parquet tables",
        r"2000 trajectories, c=256, 50 ms agent: wall ÷ ideal",
        r"2000 trajectories, c=64: wall \(start and reports included\)",
        r"peak RSS",
        r"one trajectory against the builtin agent: wall \(best of 5\)",
        r"trellis check \S+: wall \(best of 5\)",
        r"binary size",
    ] {
        // Every figure has a measured number after its name.
        let row = regex::Regex::new(&format!(r"(?m)^\s*{figure}\s+\d")).unwrap();
        assert!(row.is_match(&out), "no `{figure}` with a figure in\n{out}");
    }
    // The goal is stated stripped: the row gives that size too, below the file's own.
    #[cfg(target_os = "linux")]
    {
        let size =
            regex::Regex::new(r"(?m)^binary size\s+([\d.]+) MB \(([\d.]+) MB stripped\)$").unwrap();
        let caps = size.captures(&out).expect(&out);
        let (whole, stripped): (f64, f64) = (caps[1].parse().unwrap(), caps[2].parse().unwrap());
        assert!(stripped > 0.0 && stripped < whole, "{out}");
    }
    // The latency-bound run cannot beat its agent's own delay.
    let ratio: f64 = out
        .lines()
        .find(|l| l.contains("wall ÷ ideal"))
        .and_then(|l| l.split_whitespace().find(|w| w.ends_with('×')))
        .and_then(|w| w.trim_end_matches('×').parse().ok())
        .unwrap();
    assert!(ratio >= 1.0, "{out}");
    // Under each timed run, its wall time in four parts that add up to it; the run's own
    // part of the latency-bound figure holds its eight waves of 50 ms.
    let parts = regex::Regex::new(
        r"(?m)^  start · run · results · exit\s+([\d.]+) · ([\d.]+) · ([\d.]+) · ([\d.]+) ms$",
    )
    .unwrap();
    let splits: Vec<[f64; 4]> = parts
        .captures_iter(&out)
        .map(|c| [1, 2, 3, 4].map(|i| c[i].parse().unwrap()))
        .collect();
    assert_eq!(splits.len(), 3, "{out}");
    let latency_wall: f64 = regex::Regex::new(r"wall ÷ ideal\s+[\d.]+× \(([\d.]+) s\)")
        .unwrap()
        .captures(&out)
        .and_then(|c| c[1].parse().ok())
        .expect(&out);
    let [start, run, results, exit] = splits[1];
    assert!(run >= 400.0, "{out}");
    assert!(start > 0.0 && results > 0.0 && exit > 0.0, "{out}");
    let sum = (start + run + results + exit) / 1000.0;
    assert!(
        (sum - latency_wall).abs() < 0.003,
        "{sum} s against {latency_wall} s\n{out}"
    );
}

/// `--runs N`: every timed figure is the median of N runs of each binary with their range,
/// and under it the split of the median run; the binaries take turns.
#[tokio::test]
async fn bench_table_with_runs_gives_each_figure_as_a_median_and_its_range() {
    let exe = env!("CARGO_BIN_EXE_trellis");
    let o = trellis()
        .args(["bench", "--table", "--trajectories", "50", "--runs", "2"])
        .args(["--exe", exe, "--exe", exe, "--suites"])
        .arg(repo("suites"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // `median (min–max)` in both columns, the median within the range.
    let spread = r"([\d.]+)(?:×| s| MiB)? \(([\d.]+)–([\d.]+)\)";
    for figure in [
        r"50 one-turn trajectories, c=256: turns/s",
        r"2000 trajectories, c=256, 50 ms agent: wall ÷ ideal",
        r"2000 trajectories, c=64: wall \(start and reports included\)",
        r"  peak RSS",
    ] {
        let row = regex::Regex::new(&format!(r"(?m)^{figure}\s+{spread}\s+{spread}$")).unwrap();
        let caps = row
            .captures(&out)
            .unwrap_or_else(|| panic!("no `{figure}` as two medians and ranges in\n{out}"));
        for column in [1, 4] {
            let [median, low, high]: [f64; 3] =
                [0, 1, 2].map(|k| caps[column + k].parse().unwrap());
            assert!(
                low <= median && median <= high,
                "{figure}: {median} not in {low}–{high}\n{out}"
            );
        }
    }
    // The latency-bound run cannot beat its agent's own delay, in any round.
    let latency = regex::Regex::new(r"wall ÷ ideal\s+[\d.]+× \(([\d.]+)–").unwrap();
    let lowest: f64 = latency.captures(&out).expect(&out)[1].parse().unwrap();
    assert!(lowest >= 1.0, "{out}");
    // A split under each timed figure, for both binaries.
    let split = regex::Regex::new(
        r"(?m)^  start · run · results · exit\s+[\d.]+ · [\d.]+ · [\d.]+ · [\d.]+ ms\s+[\d.]+ · [\d.]+ · [\d.]+ · [\d.]+ ms$",
    )
    .unwrap();
    assert_eq!(split.find_iter(&out).count(), 3, "{out}");
    for figure in [
        r"one trajectory against the builtin agent: wall \(best of 5\)",
        r"trellis check \S+: wall \(best of 5\)",
    ] {
        let row = regex::Regex::new(&format!(r"(?m)^{figure}\s+[\d.]+ ms\s+[\d.]+ ms$")).unwrap();
        assert!(
            row.is_match(&out),
            "no `{figure}` for both binaries in\n{out}"
        );
    }
    // Zero runs measure nothing: a usage error, not an empty table.
    let zero = trellis()
        .args(["bench", "--table", "--runs", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
}

#[tokio::test]
async fn bench_table_gives_no_figure_from_runs_against_an_agent_that_is_down() {
    // Nothing listens on it, so every call is refused.
    let (_held, port) = refused_port();
    let url = format!("http://127.0.0.1:{port}/agent/respond");
    let o = trellis()
        .args(["bench", "--table", "--trajectories", "50", "--url", &url])
        .args(["--suites"])
        .arg(repo("suites"))
        .output()
        .await
        .unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    for figure in [
        r"50 one-turn trajectories, c=256: turns/s",
        r"journal ÷ Parquet tables",
        r"2000 trajectories, c=64: wall \(start and reports included\)",
    ] {
        let row = regex::Regex::new(&format!(r"(?m)^\s*{figure}\s+failed$")).unwrap();
        assert!(row.is_match(&out), "`{figure}` is not `failed` in\n{out}");
    }
    assert!(
        err.contains("had trajectories that failed: the agent did not answer every call"),
        "{err}"
    );
    // What does not call that agent is still measured.
    let builtin =
        regex::Regex::new(r"(?m)^one trajectory against the builtin agent: .*\s\d").unwrap();
    assert!(builtin.is_match(&out), "{out}");
}

#[tokio::test]
async fn header_values_are_templates_over_the_turns_variables() {
    use super::support::{MisbehavingServer, OK_BODY};
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("headers.kdl");
    let text = |tenant_for_b: &str| {
        format!(
            r#"agent "bot" protocol="connexity" url="{}" {{
    header "X-Static" "fixed"
    header "X-Scenario" "{{{{ scenario.id }}}}"
    header "X-Tenant" "{{{{ user_context.tenant }}}}-{{{{ vars.size }}}}"
}}
scenario "a" {{
    user-context {{ tenant "acme" }}
    matrix {{ size "s" "m" }}
    user "hello"
    user "again"
    expect reply contains="Hello"
}}
scenario "b" {{
    user-context {{ {tenant_for_b} }}
    matrix {{ size "l" }}
    user "hi"
    expect reply contains="Hello"
}}
"#,
            agent.url()
        )
    };
    // A header reading what one of the agent's scenarios does not have: check names it.
    std::fs::write(&suite, text("other \"x\"")).unwrap();
    let o = trellis().arg("check").arg(&suite).output().await.unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("user_context.tenant"), "{err}");
    // Said once, for the scenario that lacks it; the report wraps long lines.
    assert!(err.contains("header `X-Tenant`"), "{err}");
    assert!(err.contains("scenario `b`"), "{err}");
    assert!(err.contains("1 error"), "{err}");
    assert_eq!(agent.requests(), 0);

    std::fs::write(&suite, text("tenant \"globex\"")).unwrap();
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut seen: Vec<(String, String, String)> = agent
        .recorded()
        .iter()
        .map(|r| {
            (
                r.header("x-static").unwrap_or_default(),
                r.header("x-scenario").unwrap_or_default(),
                r.header("x-tenant").unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    let row = |s: &str, t: &str| ("fixed".to_owned(), s.to_owned(), t.to_owned());
    assert_eq!(
        seen,
        // `scenario.id` is the matrix instance's id.
        [
            row("a[size=m]", "acme-m"),
            row("a[size=m]", "acme-m"),
            row("a[size=s]", "acme-s"),
            row("a[size=s]", "acme-s"),
            row("b[size=l]", "globex-l"),
        ]
    );
}

/// Suites linked into the directory (a file, a directory of them) run like the others: a
/// failing scenario behind a link must not go unrun while the run exits 0. A file reached
/// by its link and by its place is loaded once.
#[tokio::test]
async fn linked_suite_files_and_directories_are_loaded_once() {
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    let team = dir.path().join("team");
    std::fs::create_dir_all(&suites).unwrap();
    std::fs::create_dir_all(team.join("more")).unwrap();
    let scenario = |name: &str, expected: &str| {
        format!(
            "scenario \"{name}\" {{\n    agent \"demo\"\n    user \"Hi\"\n    \
             expect reply contains=\"{expected}\"\n}}\n"
        )
    };
    std::fs::write(
        suites.join("main.kdl"),
        format!(
            "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n{}",
            scenario("here", "postal")
        ),
    )
    .unwrap();
    std::fs::write(team.join("team.kdl"), scenario("linked", "no such words")).unwrap();
    std::fs::write(team.join("more/deep.kdl"), scenario("deep", "postal")).unwrap();
    std::os::unix::fs::symlink(team.join("team.kdl"), suites.join("team.kdl")).unwrap();
    std::os::unix::fs::symlink(team.join("more"), suites.join("more")).unwrap();
    // The same file again, by a second link: still one suite.
    std::os::unix::fs::symlink(team.join("team.kdl"), suites.join("zz-again.kdl")).unwrap();
    // Emacs's lock on a buffer with unsaved changes: a link to nowhere, not a suite file.
    std::os::unix::fs::symlink("user@host.1234:1700000000", suites.join(".#main.kdl")).unwrap();

    let o = trellis().arg("check").arg(&suites).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("3 files, 3 suites, 3 scenarios"),
        "{}",
        stdout(&o)
    );
    let o = trellis()
        .args(["run", "-q", "--out"])
        .arg(dir.path().join("out"))
        .arg(&suites)
        .output()
        .await
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "the linked scenario fails: {}",
        stdout(&o)
    );
    let t = read_parquet(&dir.path().join("out/trajectories.parquet"));
    let mut ran: Vec<_> = strings(&t, "scenario").into_iter().flatten().collect();
    ran.sort();
    assert_eq!(ran, ["deep", "here", "linked"]);
}

/// A trajectory that passed the checks that ran, with one that did not (a judge with no
/// provider), says so in its JUnit case: the case was a bare pass, and only the console
/// listed what went unchecked.
#[tokio::test]
async fn a_passing_junit_case_says_which_checks_did_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("mixed.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"mixed\" {\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
         expect no-error\n    expect judge \"The agent is polite & <kind>\"\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .args(["run", "-q", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let junit = std::fs::read_to_string(out.join("junit.xml")).unwrap();
    assert!(
        junit.contains(
            "<system-out>passed the checks that ran; not checked:&#10;judge &quot;The agent is \
             polite &amp; &lt;kind&gt;&quot; [judge]: no judge configured"
        ),
        "{junit}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("(see --strict)"), "the report's banner");

    // Under --strict the same trajectory failed, and the report's banner says so rather
    // than pointing at --strict.
    let o = trellis()
        .args(["run", "-q", "--strict", "--replace", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("this run was made with --strict: those trajectories failed"),
        "the report's banner under --strict"
    );
}

/// A model agent's `system-prompt` sees the scenario's `persona`, `user_context` and
/// `scenario` as the language says: rendered for each conversation and sent with each of its
/// requests (an `env`-only one once per run, as before). One that reads what a scenario
/// running against the agent lacks is an error at `check`, naming that scenario, and nothing
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_agents_system_prompt_sees_the_scenarios_variables() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("served")])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    let agents = format!(
        "agent \"c1\" protocol=\"openai\" base-url=\"{url}\" model=\"m\" \
         system-prompt=\"You serve a {{{{ persona.type }}}} ({{{{ user_context.plan }}}}) in \
         {{{{ scenario.id }}}}.\"\n\
         agent \"c2\" protocol=\"openai\" base-url=\"{url}\" model=\"m\" \
         system-prompt=\"Only env: {{{{ env.TRELLIS_SP_TEST }}}}\"\n\
         persona \"p\" type=\"tester\" {{ description \"pd\" }}\n",
        url = fake.base_url()
    );
    let scenarios = "scenario \"s1\" {\n    agent \"c1\"\n    persona \"p\"\n    \
         user-context { plan \"gold\" }\n    user \"hi\"\n    user \"again\"\n    \
         expect reply contains=\"served\"\n}\n\
         scenario \"s2\" {\n    agent \"c2\"\n    user \"hi\"\n    expect no-error\n}\n";
    std::fs::write(&suite, format!("{agents}{scenarios}")).unwrap();
    let o = trellis()
        .env("TRELLIS_SP_TEST", "yes")
        .args(["run", "-q", "--out"])
        .arg(dir.path().join("out"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut systems: Vec<String> = fake
        .seen()
        .iter()
        .map(|r| {
            let messages = r.body["messages"].as_array().unwrap();
            assert_eq!(messages[0]["role"], "system", "{}", r.body);
            messages[0]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    systems.sort();
    assert_eq!(
        systems,
        [
            "Only env: yes",
            "You serve a tester (gold) in s1.",
            "You serve a tester (gold) in s1."
        ]
    );

    // A scenario without the persona the prompt reads: `check` says so, exit 2.
    std::fs::write(
        &suite,
        format!("{agents}{scenarios}scenario \"s3\" {{\n    agent \"c1\"\n    user \"hi\"\n}}\n"),
    )
    .unwrap();
    let calls = fake.calls();
    let o = trellis()
        .args(["run", "-q", "--out"])
        .arg(dir.path().join("out2"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("persona.type"), "{err}");
    assert!(err.contains("`system-prompt` of agent `c1`"), "{err}");
    assert!(err.contains("scenario `s3`"), "{err}");
    assert_eq!(fake.calls(), calls, "nothing runs");
}

/// An agent's `url` may read `env` (a port chosen when CI starts the agent): rendered once
/// per run, and what it renders to is checked as a URL written whole is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_url_reads_env_and_a_bad_rendering_is_a_setup_fault() {
    let (addr, _agent) = super::faults::echoing_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("url.kdl");
    std::fs::write(
        &suite,
        r#"agent "web" protocol="connexity" url="http://127.0.0.1:{{ env.AGENT_PORT }}/agent/respond"
scenario "s" {
    user "hello"
    expect reply contains="you sent"
}
"#,
    )
    .unwrap();
    let run = |out: &str, port: &str| {
        trellis()
            .args(["run", "--quiet", "--out"])
            .arg(dir.path().join(out))
            .arg(&suite)
            .env("AGENT_PORT", port)
            .env("NO_COLOR", "1")
            .output()
    };
    let o = run("good", &addr.port().to_string()).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = run("bad", "abc").await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let console = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        console.contains(
            "renders to `http://127.0.0.1:abc/agent/respond`: its port is not a number from 1 \
             to 65535"
        ),
        "{console}"
    );
    let faults = strings(
        &read_parquet(&dir.path().join("bad/trajectories.parquet")),
        "fault_category",
    );
    assert_eq!(faults, [Some("setup".to_string())]);
}

/// A Connexity answer's `metadata` (the agent's own trace URL, prompt version) is kept as
/// sent: in the journal's turn and in `turns.parquet`'s `agent_metadata`; `{}` says nothing.
#[tokio::test]
async fn a_connexity_answers_metadata_is_kept_with_its_turn() {
    use super::support::MisbehavingServer;
    let with = serde_json::json!({
        "messages": [{"role": "assistant", "content": "Hello! What is your postal code?"}],
        "model": "gpt-4o",
        "metadata": {"trace_url": "https://traces.example/t/42", "prompt_version": "v7"},
    });
    let empty = serde_json::json!({
        "messages": [{"role": "assistant", "content": "Hello! What is your postal code?"}],
        "metadata": {},
    });
    let tracing = MisbehavingServer::respond(200, with.to_string()).await;
    let quiet = MisbehavingServer::respond(200, empty.to_string()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("meta.kdl"),
        format!(
            "agent \"tracing\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"quiet\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"hi\" {{\n    agents \"tracing\" \"quiet\"\n    user \"hi\"\n    \
             expect reply contains=\"postal code\"\n}}\n",
            tracing.url(),
            quiet.url()
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let turns = read_parquet(&out.join("turns.parquet"));
    let by_agent: std::collections::BTreeMap<String, Option<String>> = strings(&turns, "agent")
        .into_iter()
        .map(Option::unwrap_or_default)
        .zip(strings(&turns, "agent_metadata"))
        .collect();
    let sent: serde_json::Value = serde_json::from_str(
        by_agent["tracing"]
            .as_deref()
            .expect("the tracing agent's metadata"),
    )
    .unwrap();
    assert_eq!(sent, with["metadata"]);
    assert_eq!(by_agent["quiet"], None);
    assert!(journal_text(&out).contains("https://traces.example/t/42"));
    // And on the turn's line in the report, where someone debugging the agent looks.
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        page.contains("metadata {&quot;prompt_version&quot;:&quot;v7&quot;,&quot;trace_url"),
        "not in the report"
    );
    assert!(page.contains("traces.example"), "not in the report");
}

/// `trellis show` prints a run's transcripts from its journal: by default those that did
/// not pass, each turn's message, tool calls and answer, then its checks; `--all` the rest.
#[tokio::test]
async fn show_prints_the_transcripts_of_what_did_not_pass() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"greets\" {\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
         expect reply contains=\"postal code\"\n}\n\
         scenario \"wrong\" {\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
         expect reply contains=\"NEVER SAID\"\n}\n",
    )
    .unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = trellis()
        .current_dir(dir.path())
        .arg("show")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("FAILED s/wrong · main [c #0]"), "{out}");
    assert!(
        out.contains("    user: Hi, I'd like to book a duct cleaning."),
        "{out}"
    );
    assert!(out.contains("    agent: I can help with that."), "{out}");
    assert!(
        out.contains("  ✗ turn 0: reply contains=\"NEVER SAID\""),
        "{out}"
    );
    assert!(
        !out.contains("s/greets"),
        "passed: not shown by default: {out}"
    );

    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "--all", "--filter", "greets"])
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert!(out.contains("PASSED s/greets · main [c #0]"), "{out}");
    assert!(!out.contains("s/wrong"), "{out}");

    // `--limit 0` counts what it does not show.
    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "--limit", "0"])
        .output()
        .await
        .unwrap();
    assert!(
        stdout(&o).contains("… and 1 more trajectories that did not pass"),
        "{}",
        stdout(&o)
    );

    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "no-such-run"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `show --all` promises every trajectory: the default limit of 10 does not cut it, an
/// explicit `--limit` still does.
#[tokio::test]
async fn show_all_is_not_cut_at_the_default_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut suite = String::from("agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n");
    for i in 0..12 {
        suite.push_str(&format!(
            "scenario \"s{i}\" {{\n    user \"Hi\"\n    expect reply contains=\"help\"\n}}\n"
        ));
    }
    std::fs::write(dir.path().join("s.kdl"), suite).unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "--all"])
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert_eq!(out.matches("PASSED s/").count(), 12, "{out}");
    assert!(!out.contains("more trajectories"), "{out}");
    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "--all", "--limit", "3"])
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert_eq!(out.matches("PASSED s/").count(), 3, "{out}");
    assert!(out.contains("… and 9 more trajectories"), "{out}");
}

/// A branch of a session-bound agent replays the prefix in a session of its own: `show`
/// prints that conversation, the prefix once (replayed), not the first branch's prefix
/// turns and then their replay.
#[tokio::test]
async fn show_prints_a_replayed_branch_as_its_own_session_had_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"w\" protocol=\"agentscope\" builtin=\"weather\"\n\
         scenario \"fork\" {\n    user \"What is the weather in Paris?\"\n    \
         branch \"a\" {\n        user \"And tomorrow?\"\n    }\n    \
         branch \"b\" {\n        user \"And in Rome?\"\n    }\n    \
         criteria {\n        no-error\n    }\n}\n",
    )
    .unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = trellis()
        .current_dir(dir.path())
        .args(["show", "--all"])
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    let b = out
        .split("\n\n")
        .find(|t| t.contains("s/fork · b [w #0]"))
        .unwrap_or_else(|| panic!("no branch b: {out}"));
    assert_eq!(b.matches("  turn 0 (").count(), 1, "{b}");
    assert!(b.contains("turn 0 (user, "), "{b}");
    assert!(b.contains(", replayed prefix)"), "{b}");
    assert!(b.contains("(a session of its own"), "{b}");
    let a = out
        .split("\n\n")
        .find(|t| t.contains("s/fork · a [w #0]"))
        .unwrap_or_else(|| panic!("no branch a: {out}"));
    assert_eq!(a.matches("  turn 0 (").count(), 1, "{a}");
    assert!(!a.contains("replayed"), "{a}");
}

/// Matrix instances are listed as people order them, `m[a=2]` before `m[a=10]`, in the
/// run's summary and in a comparison.
#[tokio::test]
async fn instances_are_listed_in_natural_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"m\" {\n    matrix { a 10 2 1; }\n    user \"hi {{ vars.a }}\"\n    \
         expect no-error\n}\n",
    )
    .unwrap();
    for out in ["r1", "r2"] {
        let o = trellis()
            .current_dir(dir.path())
            .args(["run", "s.kdl", "--out", out])
            .env("NO_COLOR", "1")
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = stdout(&o);
        let at = |id: &str| text.find(id).unwrap_or_else(|| panic!("{id}: {text}"));
        assert!(
            at("m[a=1]") < at("m[a=2]") && at("m[a=2]") < at("m[a=10]"),
            "{text}"
        );
    }
    let o = trellis()
        .current_dir(dir.path())
        .args(["compare", "r1", "r2", "--dir", ".", "--json"])
        .output()
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let order: Vec<&str> = json["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["m[a=1]", "m[a=2]", "m[a=10]"]);
}

/// `--repeat N` runs every selected scenario N times, whatever its `repeat` says.
#[tokio::test]
async fn repeat_runs_every_scenario_that_many_times() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"once\" {\n    user \"hi\"\n    expect no-error\n}\n\
         scenario \"twice\" {\n    repeat 2\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .args(["--repeat", "3", "-q", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trajectories = journal_trajectories(&out);
    for scenario in ["once", "twice"] {
        let mut repetitions: Vec<u64> = trajectories
            .iter()
            .filter(|t| t["scenario"] == scenario)
            .filter_map(|t| t["repetition"].as_u64())
            .collect();
        repetitions.sort_unstable();
        assert_eq!(repetitions, [0, 1, 2], "{scenario}");
    }
    let o = trellis()
        .arg("run")
        .arg(dir.path().join("s.kdl"))
        .args(["--repeat", "0"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// A stream cut short keeps the text the agent had sent (the turn's `messages`, with an
/// `incomplete` fault): `show` prints it as such, not as "no answer".
#[tokio::test]
async fn show_prints_what_a_cut_stream_had_sent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/process", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = vec![0u8; 65536];
            let _ = stream.read(&mut buf).await;
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\r\n",
            );
            for event in [
                r#"{"sequence_number":0,"object":"response","id":"r1","status":"created"}"#,
                r#"{"sequence_number":1,"object":"response","id":"r1","status":"in_progress"}"#,
                r#"{"object":"message","id":"m0","type":"message","role":"assistant","status":"completed","content":[{"type":"text","text":"First part.","delta":null}]}"#,
                r#"{"object":"content","type":"text","delta":true,"msg_id":"m1","index":0,"status":"in_progress","text":"Half an "}"#,
                r#"{"object":"content","type":"text","delta":true,"msg_id":"m1","index":0,"status":"in_progress","text":"answer"}"#,
            ] {
                out.push_str(&format!("data: {event}\n\n"));
            }
            let _ = stream.write_all(out.as_bytes()).await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        format!(
            "agent \"w\" protocol=\"agentscope\" url=\"{url}\"\n\
             scenario \"cut\" {{\n    user \"Hi\"\n    expect no-error\n}}\n"
        ),
    )
    .unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "s.kdl", "-q"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let o = trellis()
        .current_dir(dir.path())
        .arg("show")
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert!(
        out.contains("    agent (cut short, what it had sent): First part.⏎ Half an answer"),
        "{out}"
    );
    assert!(out.contains("fault (incomplete)"), "{out}");
}
