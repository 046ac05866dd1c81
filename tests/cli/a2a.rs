//! `protocol="a2a"` through the `trellis` binary: the example suite against the builtin
//! `travel` agent, a failed task recorded as the agent's error, structured-data checks and
//! captures, and the agent card in the journal.

use serde_json::Value;

use crate::{repo, stderr, stdout, trellis};

async fn run(dir: &std::path::Path, suite: &str) -> (std::process::Output, Vec<Value>) {
    std::fs::write(dir.join("a2a.kdl"), suite).unwrap();
    let out = dir.join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.join("a2a.kdl"))
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    let journal = crate::journal_text(&out);
    let entries = journal
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (o, entries)
}

/// The example suite passes in full, over `message/stream` and `message/send`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_suite_passes() {
    let dir = tempfile::tempdir().unwrap();
    let o = trellis()
        .arg("run")
        .arg(repo("suites/a2a.kdl"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("5 passed, 0 failed"), "{}", stdout(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_is_an_agent_error_and_data_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (o, journal) = run(
        dir.path(),
        "agent \"travel\" protocol=\"a2a\" builtin=\"travel\"\n\
         scenario \"atlantis\" {\n    user \"Fly me to Atlantis\"\n}\n\
         scenario \"rome\" {\n    user \"Book a flight to Rome\"\n    user \"May 1\"\n    \
         capture \"price\" json-path=\"$.artifacts[0].parts[?@.kind == 'data'].data.price\"\n    \
         expect {\n        reply json-path=\"$.status.state\" equals=\"completed\"\n        \
         reply json-path=\"$.status.message.role\" equals=\"agent\"\n        \
         reply json-path=\"$.artifacts[0].parts[?@.kind == 'data'].data.price\" equals=300\n        \
         reply contains=\"Price: {{ vars.price }} EUR\"\n    }\n}\n\
         scenario \"wrong-price\" {\n    user \"Book a flight to Rome\"\n    user \"May 1\"\n    \
         expect reply json-path=\"$.artifacts[0].parts[?@.kind == 'data'].data.price\" equals=1\n}\n",
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("1 passed, 1 failed, 1 error"), "{out}");
    assert!(
        out.contains("agent_error fault: the agent's task failed: \"No flights to Atlantis"),
        "{out}"
    );
    assert!(
        out.contains(
            "json-path $.artifacts[0].parts[?@.kind == 'data'].data.price is 300, expected 1"
        ),
        "{out}"
    );
    // The card is recorded once per agent.
    let cards: Vec<&Value> = journal.iter().filter_map(|e| e.get("agent")).collect();
    assert_eq!(cards.len(), 1, "{cards:?}");
    assert_eq!(cards[0]["info"]["card"]["name"], "Travel desk");
    assert_eq!(cards[0]["info"]["stream"], true);
}
