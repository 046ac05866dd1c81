//! MultiAgentEval agents as processes, through the binary: whatever a run starts, it ends —
//! after a clean run, on SIGTERM, and call by call (no zombies while the run goes on).

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// A long-lived agent (one JSON line in, one out) that records its pid and the pid of a
/// grandchild it leaves running, and hangs on a task that says `hang`.
const LONG_LIVED: &str = r#"
import json, os, subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "1000"])
with open(os.environ["PIDS"], "a") as f:
    f.write(f"{os.getpid()}\n{grandchild.pid}\n")
for line in sys.stdin:
    task = json.loads(line)["task_description"]
    if "hang" in task:
        time.sleep(1000)
    print(json.dumps({"action": "final_answer", "summary": "done: " + task}), flush=True)
"#;

/// One process per call; records its pid; `slow` takes two seconds.
const PER_CALL: &str = r#"
import json, os, sys, time
task = json.loads(sys.stdin.read())["task_description"]
with open(os.environ["PIDS"], "a") as f:
    f.write(f"{os.getpid()} {task}\n")
if task == "slow":
    time.sleep(2)
print(json.dumps({"action": "final_answer", "summary": "done: " + task}))
"#;

fn write_agent(dir: &Path, script: &str, process: &str, scenarios: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("agent.py"), script).unwrap();
    let suite = dir.join("suite.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "proc" protocol="multiagent" command="python3 -u agent.py" cwd="." process="{process}" {{
    env {{ PIDS "{}" }}
}}
{scenarios}
"#,
            dir.join("pids").display()
        ),
    )
    .unwrap();
    suite
}

fn pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// `(state, parent pid)` of a live process, from /proc; `None` once it is gone.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is parenthesised and may contain spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Running or sleeping: not gone, not a zombie waiting for its parent.
fn running(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_long_lived_agent_and_its_children_end_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        LONG_LIVED,
        "long-lived",
        r#"scenario "a" { user "one"; expect reply equals="done: one"; user "two" }
scenario "b" { user "three" }"#,
    );
    let o = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("run"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let started = pids(dir.path());
    assert_eq!(started.len(), 2, "one process for the run: {started:?}");
    wait_until(
        "the agent's process tree to end",
        Duration::from_secs(5),
        || !started.iter().any(|&p| running(p)),
    )
    .await;
}

#[tokio::test]
async fn sigterm_ends_a_hanging_agent_process_tree() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        LONG_LIVED,
        "long-lived",
        r#"scenario "stuck" { user "please hang" }"#,
    );
    let mut child = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("run"))
        .arg(&suite)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pids_dir = dir.path().to_owned();
    wait_until("the agent to start", Duration::from_secs(30), || {
        pids(&pids_dir).len() == 2
    })
    .await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("trellis did not exit after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(143));
    let started = pids(dir.path());
    wait_until(
        "the agent's process tree to end",
        Duration::from_secs(5),
        || !started.iter().any(|&p| running(p)),
    )
    .await;
}

/// `kill -9` (or the OOM killer) runs none of Trellis's shutdown: the kernel ends the agent
/// process it started instead of leaving it running.
#[tokio::test]
async fn an_agent_process_dies_with_a_killed_trellis() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        LONG_LIVED,
        "long-lived",
        r#"scenario "stuck" { user "please hang" }"#,
    );
    let mut child = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("run"))
        .arg(&suite)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pids_dir = dir.path().to_owned();
    wait_until("the agent to start", Duration::from_secs(30), || {
        pids(&pids_dir).len() == 2
    })
    .await;
    let (agent, grandchild) = (pids(dir.path())[0], pids(dir.path())[1]);
    assert!(running(agent));
    child.kill().await.unwrap();
    wait_until(
        "the agent to end with trellis",
        Duration::from_secs(5),
        || !running(agent),
    )
    .await;
    // What the agent started itself outlives it (nothing is left to end its group): the
    // test ends it.
    // SAFETY: kill(2) of a pid this test's agent reported; at worst it is already gone.
    unsafe { libc::kill(grandchild, libc::SIGKILL) };
}

#[tokio::test]
async fn per_call_processes_are_reaped_as_the_run_goes() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        PER_CALL,
        "per-call",
        r#"scenario "many" { user "1"; user "2"; user "3"; user "4"; user "slow" }"#,
    );
    let mut child = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("run"))
        .arg(&suite)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let trellis_pid = i32::try_from(child.id().unwrap()).unwrap();
    let pids_dir = dir.path().to_owned();
    wait_until("the slow call", Duration::from_secs(30), || {
        std::fs::read_to_string(pids_dir.join("pids")).is_ok_and(|p| p.contains(" slow"))
    })
    .await;
    // While the fifth process runs, the four before it are gone, not zombies of trellis.
    let zombies: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| proc_stat(p).is_some_and(|(state, ppid)| state == 'Z' && ppid == trellis_pid))
        .collect();
    assert!(
        zombies.is_empty(),
        "zombie children of trellis: {zombies:?}"
    );
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(pids(dir.path()).len(), 5);
}

/// One process per call that takes a second to answer.
const SLOW_PER_CALL: &str = r#"
import json, sys, time
task = json.loads(sys.stdin.read())["task_description"]
time.sleep(1)
print(json.dumps({"action": "final_answer", "summary": "done: " + task}))
"#;

/// A long-lived agent that takes a second per answer (one call at a time on its pipe).
const SLOW_LONG_LIVED: &str = r#"
import json, sys, time
for line in sys.stdin:
    task = json.loads(line)["task_description"]
    time.sleep(1)
    print(json.dumps({"action": "final_answer", "summary": "done: " + task}), flush=True)
"#;

/// Each trajectory's `duration_ms` and its turn's `latency_ms`, from the run's tables.
fn durations(out: &Path) -> (Vec<f64>, Vec<f64>) {
    let column = |file: &str, name: &str| -> Vec<f64> {
        read_parquet(&out.join(file))
            .column(name)
            .unwrap()
            .f64()
            .unwrap()
            .into_no_null_iter()
            .collect()
    };
    (
        column("trajectories.parquet", "duration_ms"),
        column("turns.parquet", "latency_ms"),
    )
}

async fn run_slow_agent(dir: &Path, script: &str, process: &str) -> (Duration, Vec<f64>, Vec<f64>) {
    std::fs::write(dir.join("agent.py"), script).unwrap();
    let suite = dir.join("suite.kdl");
    std::fs::write(
        &suite,
        format!(
            r#"agent "proc" protocol="multiagent" command="python3 -u agent.py" cwd="." process="{process}" concurrency=8
scenario "s" {{
    repeat 4
    user "hello"
    expect reply equals="done: hello"
}}
"#
        ),
    )
    .unwrap();
    let out = dir.join("run");
    let started = Instant::now();
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let (trajectories, turns) = durations(&out);
    assert_eq!((trajectories.len(), turns.len()), (4, 4));
    (took, trajectories, turns)
}

#[tokio::test]
async fn per_call_processes_run_side_by_side_up_to_the_agents_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let (took, trajectories, turns) = run_slow_agent(dir.path(), SLOW_PER_CALL, "per-call").await;
    // Four one-second calls one after the other take four seconds at least.
    assert!(
        took < Duration::from_millis(3900),
        "4 calls with concurrency=8 took {took:?}: they ran one at a time"
    );
    // Each call's second plus a Python start, which takes over a second on a loaded machine.
    for ms in trajectories.iter().chain(&turns) {
        assert!(*ms >= 1000.0 && *ms < 3500.0, "{trajectories:?} {turns:?}");
    }
}

#[tokio::test]
async fn waiting_for_a_long_lived_agents_pipe_is_not_the_agents_time() {
    let dir = tempfile::tempdir().unwrap();
    let (took, trajectories, turns) =
        run_slow_agent(dir.path(), SLOW_LONG_LIVED, "long-lived").await;
    // One pipe answers one call at a time: the run takes four seconds, but each
    // trajectory's own time is its one-second turn, not the wait behind the others.
    assert!(took >= Duration::from_secs(4), "{took:?}");
    for ms in trajectories.iter().chain(&turns) {
        assert!(*ms >= 1000.0 && *ms < 2500.0, "{trajectories:?} {turns:?}");
    }
}

/// A long-lived agent that writes a log line on stdout before its answer when the task
/// starts with `log` (the answer is left in the pipe behind the line that was not one), and
/// its answer twice when it starts with `dup`.
const STRAY_LINE: &str = r#"
import json, os, sys
with open(os.environ["PIDS"], "a") as f:
    f.write(f"{os.getpid()}\n")
for line in sys.stdin:
    task = json.loads(line)["task_description"]
    if task.startswith("log"):
        print("INFO working on it")
    if task.startswith("err"):
        print(json.dumps({"action": "error", "message": "a stray error report"}))
    answer = json.dumps({"action": "final_answer", "summary": "answer to: " + task})
    if task.startswith("dup"):
        # Twice, in one write: the second line is in the pipe as the first is read.
        sys.stdout.write(answer + "\n" + answer + "\n")
        sys.stdout.flush()
        continue
    print(answer, flush=True)
"#;

#[tokio::test]
async fn a_stray_line_from_a_long_lived_agent_never_answers_the_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        STRAY_LINE,
        "long-lived",
        r#"scenario "a-logs" { user "log please"; expect no-error }
scenario "a2-errs" { user "err please"; expect no-error }
scenario "a3-dup" { user "dup please"; expect no-error }
scenario "b-clean" { user "second"; expect reply equals="answer to: second" }
scenario "c-clean" { user "third"; expect reply equals="answer to: third" }"#,
    );
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--jobs", "1", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    let t = read_parquet(&out.join("trajectories.parquet"));
    let statuses: Vec<(String, String)> = strings(&t, "scenario")
        .into_iter()
        .zip(strings(&t, "status"))
        .map(|(s, st)| (s.unwrap(), st.unwrap()))
        .collect();
    assert_eq!(o.status.code(), Some(1), "{statuses:?} {}", stderr(&o));
    let status_of = |name: &str| {
        statuses
            .iter()
            .find(|(s, _)| s == name)
            .map(|(_, st)| st.as_str())
    };
    assert_eq!(status_of("a-logs"), Some("error"), "{statuses:?}");
    assert_eq!(status_of("a2-errs"), Some("error"), "{statuses:?}");
    // An answer written twice: the second line would answer the next call.
    assert_eq!(status_of("a3-dup"), Some("error"), "{statuses:?}");
    let turns = read_parquet(&out.join("turns.parquet"));
    let faults: Vec<String> = strings(&turns, "fault_message")
        .into_iter()
        .flatten()
        .collect();
    assert!(
        faults
            .iter()
            .any(|f| f.contains("wrote another line after its answer")),
        "{faults:?}"
    );
    // Each later call got its own answer, from a process started afresh.
    assert_eq!(status_of("b-clean"), Some("passed"), "{statuses:?}");
    assert_eq!(status_of("c-clean"), Some("passed"), "{statuses:?}");
    // Started again after each refused line that a later call followed (the order the
    // scenarios take the one call slot decides whether the last call was one of them).
    assert!(pids(dir.path()).len() >= 2, "{:?}", pids(dir.path()));
}

/// A stop starts no agent call: turns queued behind a long-lived process's one call at a
/// time are not sent once the run stops; the turn in flight is finished within the grace,
/// the request that sends its tool's result included, and `--resume` runs the rest.
#[tokio::test]
async fn calls_queued_at_a_long_lived_process_are_not_sent_after_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.log");
    let agent = dir.path().join("slow.py");
    std::fs::write(
        &agent,
        format!(
            "import json, sys, time\n\
             for line in sys.stdin:\n\
             \x20   with open({log:?}, 'a') as f: f.write(line)\n\
             \x20   if json.loads(line).get('task_description', '').startswith('Tool'):\n\
             \x20       print(json.dumps({{\"action\": \"final_answer\", \"summary\": \"done\"}}), flush=True)\n\
             \x20   else:\n\
             \x20       time.sleep(0.6)\n\
             \x20       print(json.dumps({{\"action\": \"call_tool\", \"tool_name\": \"lookup\", \"tool_params\": {{}}}}), flush=True)\n",
            log = log.display().to_string()
        ),
    )
    .unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        format!(
            "agent \"slow\" protocol=\"multiagent\" command=\"python3 -u {}\" process=\"long-lived\"\n\
             scenario \"s\" {{\n    repeat 4\n    tool \"lookup\" {{ mock returns=\"{{\\\"status\\\":\\\"success\\\"}}\" }}\n    \
             user \"hi\"\n    expect no-error\n}}\n",
            agent.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("run");
    let mut child = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let sent = || {
        std::fs::read_to_string(&log)
            .map(|text| text.lines().count())
            .unwrap_or(0)
    };
    wait_until("the first request", Duration::from_secs(30), || sent() == 1).await;
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("trellis did not exit after SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    // The turn in flight sent its tool's result and was recorded; no queued turn started.
    assert_eq!(
        sent(),
        2,
        "a queued turn was sent after the stop, or the one in flight cut"
    );
    assert_eq!(read_parquet(&out.join("trajectories.parquet")).height(), 1);

    let o = trellis()
        .args(["run", "--resume"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(sent(), 8, "the resumed run sent the three turns left");
}

/// A long-lived agent that dies on a task it has read, the first time it reads it: started
/// again, it answers.
const DIES_ONCE: &str = r#"
import json, os, sys
for line in sys.stdin:
    task = json.loads(line)["task_description"]
    mark = os.environ["PIDS"] + ".died"
    if "fragile" in task and not os.path.exists(mark):
        open(mark, "w").close()
        sys.exit(1)
    print(json.dumps({"action": "final_answer", "summary": "done: " + task}), flush=True)
"#;

/// A long-lived process that dies under a request is started again and sent the request
/// once more (docs/language.md), so the turn has an answer and `no-error` passes; the run
/// says the agent died: on the console, in summary.json and in report.html (it showed
/// nowhere but in that turn's log).
#[tokio::test]
async fn a_request_a_long_lived_agent_died_under_is_counted_for_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        DIES_ONCE,
        "long-lived",
        r#"scenario "a" { user "first"; expect no-error; user "fragile one"; expect no-error }"#,
    );
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = flat(&stdout(&o));
    assert!(
        said.contains(
            "the agent process `python3 -u agent.py` ended without answering 1 request; each \
             was sent again to a new process"
        ),
        "{said}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary["stats"]["aggregates"]["requests_resent"]["python3 -u agent.py"], 1,
        "{summary}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("<code>python3 -u agent.py</code> ended without answering 1 request;"),
        "the report does not say the agent died"
    );
    // A run in which it does not die says nothing of it.
    std::fs::write(dir.path().join("pids.died"), "").unwrap();
    let o = trellis()
        .args(["run", "--out"])
        .arg(dir.path().join("again"))
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("RESTARTED"), "{}", stdout(&o));
}

/// A long-lived agent that dies on a task every time: the request sent again to a new
/// process fails too, so the turn has the fault (and says it was sent again), and the run
/// does not count it among the requests a new process answered (the console said "whose
/// answer the turn has (no check fails for it)" of a turn with no answer and a failed check).
#[tokio::test]
async fn a_request_sent_again_that_fails_again_is_the_turns_fault_not_a_restart() {
    const DIES_ALWAYS: &str = r#"
import json, sys
for line in sys.stdin:
    task = json.loads(line)["task_description"]
    if "fragile" in task:
        sys.exit(3)
    print(json.dumps({"action": "final_answer", "summary": "done: " + task}), flush=True)
"#;
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        DIES_ALWAYS,
        "long-lived",
        r#"scenario "a" { user "first"; expect no-error; user "fragile one"; expect no-error }"#,
    );
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let said = flat(&stdout(&o));
    assert!(!said.contains("RESTARTED"), "{said}");
    assert!(
        said.contains(
            "the request was sent again on a new process: the first ended without answering"
        ),
        "{said}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert!(
        summary["stats"]["aggregates"]["requests_resent"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "{summary}"
    );
    let turns = read_parquet(&out.join("turns.parquet"));
    assert_eq!(
        strings(&turns, "fault_category"),
        [None, Some("transport".to_string())]
    );
}

/// A tool's result is recorded (tool_calls.result) as the agent was sent it in
/// `Tool 'NAME' returned: {…}`, not re-serialised (keys sorted, no spaces), so the record
/// can be compared with the agent's own log.
#[tokio::test]
async fn a_tool_result_is_recorded_as_the_agent_was_sent_it() {
    const CALLS_A_TOOL: &str = r#"
import json, sys
task = json.loads(sys.stdin.read())["task_description"]
if task.startswith("Tool "):
    print(json.dumps({"action": "final_answer", "summary": task}))
else:
    print(json.dumps({"action": "call_tool", "tool_name": "apply_refund", "tool_params": {"amount": 50}}))
"#;
    let dir = tempfile::tempdir().unwrap();
    let suite = write_agent(
        dir.path(),
        CALLS_A_TOOL,
        "per-call",
        r##"tool "apply_refund" { mock returns=#"{"status": "success", "refunded": 50, "note": "Zoë"}"#; }
scenario "refund" { user "refund"; expect no-error }"##,
    );
    let out = dir.path().join("run");
    let o = trellis()
        .args(["run", "--out"])
        .arg(&out)
        .arg(&suite)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let sent = strings(&read_parquet(&out.join("turns.parquet")), "reply");
    let recorded = strings(&read_parquet(&out.join("tool_calls.parquet")), "result");
    let expected = r#"{"status": "success", "note": "Zo\u00eb", "refunded": 50}"#;
    assert_eq!(recorded, [Some(expected.to_string())]);
    assert_eq!(
        sent,
        [Some(format!(
            "Tool 'apply_refund' returned: {expected}. Continue with the task."
        ))]
    );
}
