//! Misbehaving agents: each fault is recorded with its category on its trajectory, the rest
//! of the run goes on, and every finished result is written.

use std::time::Duration;

use super::support::{Behavior, MisbehavingServer, OK_BODY, closed_port};
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_category_is_recorded_and_the_run_goes_on() {
    let servers = [
        (
            "http-5xx",
            MisbehavingServer::respond(500, "upstream exploded").await,
        ),
        (
            "http-4xx",
            MisbehavingServer::respond(404, "{\"detail\":\"no\"}").await,
        ),
        (
            "invalid-json",
            MisbehavingServer::respond(200, "<html>oops</html>").await,
        ),
        (
            "protocol",
            MisbehavingServer::respond(200, "{\"answer\":\"hi\"}").await,
        ),
        (
            "slow-drip",
            MisbehavingServer::start(Behavior::SlowDrip {
                interval: Duration::from_millis(100),
            })
            .await,
        ),
        ("reset", MisbehavingServer::start(Behavior::Reset).await),
        (
            "truncated",
            MisbehavingServer::start(Behavior::Truncated).await,
        ),
        (
            "huge",
            MisbehavingServer::start(Behavior::Huge {
                bytes: 20 * 1024 * 1024,
                content_length: false,
            })
            .await,
        ),
        ("healthy", MisbehavingServer::respond(200, OK_BODY).await),
    ];
    let mut suite = String::new();
    for (name, server) in &servers {
        suite.push_str(&format!(
            "agent \"{name}\" protocol=\"connexity\" url=\"{}\" {{ timeout \"500ms\" }}\n",
            server.url()
        ));
    }
    suite.push_str(&format!(
        "agent \"connect\" protocol=\"connexity\" url=\"http://{}/agent/respond\"\n",
        closed_port().await
    ));
    let agents: Vec<&str> = servers.iter().map(|(n, _)| *n).chain(["connect"]).collect();
    suite.push_str(&format!(
        "scenario \"hello\" {{\n    agents {}\n    user \"hi\"\n    user \"again\"\n}}\n",
        agents
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("faults.kdl"), suite).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let t = read_parquet(&out.join("trajectories.parquet"));
    let rows: Vec<(String, Option<String>, String)> = strings(&t, "agent")
        .into_iter()
        .zip(strings(&t, "fault_category"))
        .zip(strings(&t, "status"))
        .map(|((a, f), s)| (a.unwrap(), f, s.unwrap()))
        .collect();
    let fault_of = |agent: &str| {
        let row = rows.iter().find(|r| r.0 == agent).unwrap();
        (row.1.clone(), row.2.clone())
    };
    for (agent, category) in [
        ("http-5xx", "http_5xx"),
        ("http-4xx", "http_4xx"),
        ("invalid-json", "invalid_json"),
        ("protocol", "protocol"),
        ("slow-drip", "timeout"),
        ("reset", "transport"),
        ("truncated", "transport"),
        ("huge", "too_large"),
        ("connect", "connect"),
    ] {
        assert_eq!(
            fault_of(agent),
            (Some(category.to_string()), "error".to_string()),
            "{agent}"
        );
    }
    assert_eq!(fault_of("healthy"), (None, "passed".to_string()));

    // The faulted turn is kept with its message; the healthy agent took both turns.
    let turns = read_parquet(&out.join("turns.parquet"));
    let messages = strings(&turns, "fault_message");
    assert!(messages.iter().flatten().any(|m| m.contains("500")));
    let healthy_turns = strings(&turns, "agent")
        .iter()
        .filter(|a| a.as_deref() == Some("healthy"))
        .count();
    assert_eq!(healthy_turns, 2);
    // The 20 MB body was not read: the server could not push anywhere near all of it.
    let huge = &servers.iter().find(|(n, _)| *n == "huge").unwrap().1;
    let written = huge
        .stats
        .body_bytes_written
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(written < 16 * 1024 * 1024, "wrote {written} bytes");
}
