//! `trellis watch` as a process: real files edited the way editors do, a counting agent on
//! a real socket, and the output read line by line. Every wait polls for a line with a
//! generous deadline, so a loaded machine makes the tests slower, never flaky.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;

use super::support::{Behavior, MisbehavingServer, OK_BODY};
use super::*;

/// Long enough for a debug build on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(90);

/// A running `trellis watch` with everything it printed so far.
struct Watch {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Lines already matched by [`Watch::wait_for`]: each wait looks past them.
    seen: usize,
}

impl Watch {
    fn start(dir: &Path, extra: &[&str]) -> Watch {
        Watch::start_on(dir, "suite.kdl", extra)
    }

    /// `trellis watch ROOT` in `dir`.
    fn start_on(dir: &Path, root: &str, extra: &[&str]) -> Watch {
        let mut cmd = trellis();
        // A pipe, not the test runner's terminal: watch reads its keys from it.
        cmd.current_dir(dir)
            .args(["watch", root, "--out", "runs"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(stderr),
        ] {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Watch {
            child,
            lines,
            seen: 0,
        }
    }

    /// `trellis watch suite.kdl` in `dir` with its output on a terminal (a pseudo-terminal
    /// of `rows` rows), as a person runs it: each rerun redraws the screen.
    fn start_on_terminal(dir: &Path, rows: u16) -> Watch {
        Watch::start_on_terminal_with(dir, rows, &[])
    }

    /// [`Watch::start_on_terminal`] with `extra` arguments.
    fn start_on_terminal_with(dir: &Path, rows: u16, extra: &[&str]) -> Watch {
        let mut cmd = trellis();
        cmd.current_dir(dir)
            .args(["watch", "suite.kdl", "--out", "runs"])
            .args(extra)
            .stderr(Stdio::null());
        let master = crate::stdout_on_terminal(&mut cmd, rows, 120);
        let child = cmd.spawn().unwrap();
        // The command holds its copy of the slave end until dropped: the reads end only
        // once no slave end is left open.
        drop(cmd);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let read_into = lines.clone();
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut file = std::fs::File::from(master);
            let mut partial = Vec::new();
            let mut buf = [0u8; 4096];
            // Linux ends a pty's reads with EIO once the last slave end is closed.
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                partial.extend_from_slice(&buf[..n]);
                while let Some(end) = partial.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line);
                    read_into
                        .lock()
                        .unwrap()
                        .push(line.trim_end_matches(['\r', '\n']).to_owned());
                }
            }
        });
        Watch {
            child,
            lines,
            seen: 0,
        }
    }

    /// Waits for a line (after the last one matched) containing `needle`; returns every
    /// line up to it.
    async fn wait_for(&mut self, needle: &str) -> Vec<String> {
        let start = tokio::time::Instant::now();
        loop {
            {
                let lines = self.lines.lock().unwrap();
                if let Some(i) = lines[self.seen..].iter().position(|l| l.contains(needle)) {
                    let upto = self.seen + i + 1;
                    let out = lines[self.seen..upto].to_vec();
                    self.seen = upto;
                    return out;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "watch exited ({status}) before printing {needle:?}:\n{}",
                    self.lines.lock().unwrap().join("\n")
                );
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no line with {needle:?} after {DEADLINE:?}:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn all(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Presses Enter, as a person at watch's terminal does.
    async fn press_enter(&mut self) {
        self.type_line(b"\n").await;
    }

    /// Writes `line` to watch's standard input.
    async fn type_line(&mut self, line: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .expect("started with a piped stdin");
        stdin.write_all(line).await.unwrap();
        stdin.flush().await.unwrap();
    }
}

/// The user messages an agent was sent last in each request, in order.
fn last_user_messages(server: &MisbehavingServer) -> Vec<String> {
    server
        .recorded()
        .iter()
        .map(|r| {
            let body = r.json();
            body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn branching_suite(url: &str, right: &str, max_turns: u32) -> String {
    format!(
        r#"agent "bot" protocol="connexity" url="{url}"
scenario "forks" {{
    user "hello"
    expect reply contains="Hello"
    branch "left" {{
        user "go left"
    }}
    branch "right" {{
        user "{right}"
        user "and on"
    }}
    criteria {{
        turns max={max_turns}
    }}
}}
scenario "other" {{
    user "something else"
}}
"#
    )
}

/// One scenario against `url` that says `users` in turn, `repeat` times.
fn repeated_suite(url: &str, scenario: &str, users: &[&str], repeat: u32) -> String {
    let users: String = users
        .iter()
        .map(|user| format!("    user \"{user}\"\n"))
        .collect();
    format!(
        "agent \"bot\" protocol=\"connexity\" url=\"{url}\"\nscenario \"{scenario}\" {{\n    \
         repeat {repeat}\n{users}}}\n"
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Saves the way many editors do: a temporary file renamed over the original.
fn atomic_write(path: &Path, text: &str) {
    let tmp = path.with_extension("kdl.tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reruns_only_the_edited_branch_and_rechecks_without_calls() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    write(&suite, &branching_suite(&agent.url(), "go right", 5));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    // hello (shared by both branches), go left, go right, and on, something else.
    assert_eq!(agent.requests(), 5, "{}", watch.all());

    // One branch: only the turns from the edited step on call the agent.
    write(&suite, &branching_suite(&agent.url(), "go RIGHT", 5));
    let lines = watch.wait_for("watch: rerun 2 done").await;
    let sent = last_user_messages(&agent);
    assert_eq!(sent[5..], ["go RIGHT", "and on"], "{}", watch.all());
    let text = lines.join("\n");
    assert!(
        text.contains("rerun suite/forks (steps changed: right)"),
        "{text}"
    );
    assert!(text.contains("· right [bot #0]"), "{text}");
    assert!(
        !text.contains("· left [bot"),
        "the untouched branch is not shown: {text}"
    );
    assert!(text.contains("2 agent calls"), "{text}");

    // A criterion only: re-checked on the recorded transcripts, no agent call.
    let before = agent.requests();
    write(&suite, &branching_suite(&agent.url(), "go RIGHT", 1));
    let lines = watch.wait_for("watch: rerun 3 done").await;
    assert_eq!(agent.requests(), before, "{}", watch.all());
    let text = lines.join("\n");
    assert!(text.contains("checks changed"), "{text}");
    assert!(text.contains("failed turns max=1"), "{text}");
    assert!(text.contains("0 agent calls"), "{text}");

    // Comments and formatting change nothing: no rerun. The next real edit is rerun 4.
    let commented = format!(
        "// a comment\n\n{}",
        branching_suite(&agent.url(), "go RIGHT", 1)
            .replace("user \"hello\"", "user   \"hello\" // hi")
    );
    write(&suite, &commented);
    tokio::time::sleep(Duration::from_millis(500)).await;
    atomic_write(&suite, &branching_suite(&agent.url(), "go RIGHT", 3));
    let lines = watch.wait_for("done").await;
    assert!(
        lines.iter().any(|l| l.contains("watch: rerun 4 done")),
        "{}",
        watch.all()
    );
    assert_eq!(agent.requests(), before, "{}", watch.all());

    // Each rerun is recorded like a run: its own directory with a journal and tables,
    // holding what reran and the turns that called the agent; `latest/` holds everything.
    let runs = run_dirs(dir.path());
    assert_eq!(runs.len(), 4, "{runs:?}");
    for run in runs.iter().chain([&dir.path().join("runs/latest")]) {
        assert!(run.join(crate::JOURNAL).is_file(), "{}", run.display());
        assert!(
            run.join("trajectories.parquet").is_file(),
            "{}",
            run.display()
        );
    }
    let (trajectories, turns) = journal(&runs[0]);
    assert_eq!(trajectories.len(), 3, "the first run records everything");
    assert_eq!(turns.len(), 5);
    let (trajectories, turns) = journal(&runs[1]);
    assert_eq!(trajectories, ["suite/forks/right"], "the branch edit");
    assert_eq!(turns, ["go RIGHT", "and on"]);
    // It plans only what it reran: the untouched branch is neither planned nor said to be
    // cut short by its report.
    let started: serde_json::Value =
        serde_json::from_str(crate::journal_text(&runs[1]).lines().next().unwrap()).unwrap();
    assert_eq!(
        started["run_started"]["scenarios"][0]["trajectories"],
        serde_json::json!(["right"]),
        "{started}"
    );
    let report = std::fs::read_to_string(runs[1].join("report.html")).unwrap();
    assert!(!report.contains("the run stopped before it"), "{report}");
    // The shared prefix it reused is said to be reused, not missing from a cut-off run; the
    // page says what a rerun's report covers.
    for run in [&runs[1], &runs[2]] {
        let report = std::fs::read_to_string(run.join("report.html")).unwrap();
        assert!(!report.contains("the run may have stopped"), "{report}");
        assert!(
            report.contains("reused from an earlier rerun: its turns are in latest"),
            "{report}"
        );
        assert!(report.contains("of a trellis watch session"), "{report}");
    }
    let (trajectories, turns) = journal(&runs[2]);
    assert_eq!(
        trajectories,
        ["suite/forks/left", "suite/forks/right"],
        "re-checked"
    );
    assert!(turns.is_empty(), "no agent call: {turns:?}");
    let (trajectories, turns) = journal(&dir.path().join("runs/latest"));
    assert_eq!(trajectories.len(), 3, "latest/ has the whole state");
    assert_eq!(
        turns.len(),
        5,
        "every turn, reused ones included: {turns:?}"
    );
    let latest = crate::journal_text(&dir.path().join("runs/latest"));
    assert!(
        latest.contains("\"reused\":true"),
        "reused turns are marked"
    );
    // The tables say what each directory holds: `latest/` shares the last rerun's run id.
    let kind = |run: &Path| {
        crate::strings(&crate::read_parquet(&run.join("runs.parquet")), "kind")[0]
            .clone()
            .unwrap()
    };
    assert_eq!(kind(&dir.path().join("runs/latest")), "watch_latest");
    for run in run_dirs(dir.path()) {
        assert_eq!(kind(&run), "watch_rerun", "{}", run.display());
    }
}

/// The rerun directories under `runs/`, oldest first (their names sort by time and rerun).
fn run_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with("latest"))
        .collect();
    runs.sort();
    runs
}

/// A run directory's journal: `suite/scenario/trajectory` of each trajectory record
/// (sorted), and the user message of every turn in its node records.
fn journal(run: &Path) -> (Vec<String>, Vec<String>) {
    let text = crate::journal_text(run);
    let mut trajectories = Vec::new();
    let mut turns = Vec::new();
    for line in text.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        if let Some(t) = entry.get("trajectory") {
            trajectories.push(format!(
                "{}/{}/{}",
                t["suite"].as_str().unwrap(),
                t["scenario"].as_str().unwrap(),
                t["trajectory"].as_str().unwrap()
            ));
        }
        if let Some(node) = entry.get("node") {
            for turn in node["turns"].as_array().unwrap() {
                turns.push(turn["user_message"].as_str().unwrap().to_owned());
            }
        }
    }
    trajectories.sort();
    (trajectories, turns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_edit_keeps_watching_and_the_next_good_save_recovers() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let good = branching_suite(&agent.url(), "go right", 5);
    write(&suite, &good);
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    let calls = agent.requests();

    write(&suite, &good.replace("user \"go left\"", "usr \"go left\""));
    let lines = watch.wait_for("the suite is invalid").await;
    let text = lines.join("\n");
    assert!(text.contains("unknown"), "the diagnostic is shown: {text}");
    assert!(text.contains("suite.kdl"), "{text}");

    // Broken KDL too.
    write(&suite, &format!("{good}\nscenario \"x\" {{"));
    watch.wait_for("the suite is invalid").await;

    // Back to what last ran: nothing to rerun.
    write(&suite, &good);
    watch.wait_for("valid again; nothing changed").await;
    assert_eq!(agent.requests(), calls);

    // A real change after that runs.
    write(&suite, &good.replace("something else", "something new"));
    watch.wait_for("watch: rerun 2 done").await;
    assert_eq!(agent.requests(), calls + 1, "{}", watch.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn included_files_are_followed_when_added_renamed_and_deleted() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    write(
        &shared.join("agents.kdl"),
        &format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{}\"\n",
            agent.url()
        ),
    );
    let main = "include \"shared/agents.kdl\"\nscenario \"base\" {\n    user \"base\"\n}\n";
    write(&suite, main);
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 1);

    // An edit to the included file reruns what uses it.
    write(
        &shared.join("agents.kdl"),
        &format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{}\" timeout=\"20s\"\n",
            agent.url()
        ),
    );
    let lines = watch.wait_for("watch: rerun 2 done").await;
    // The agent changed, not a step: said as such.
    assert!(
        lines.join("\n").contains(
            "rerun suite/base (setup changed (its agent, persona, tools, context, settings or \
             dataset row))"
        ),
        "{}",
        watch.all()
    );
    assert_eq!(agent.requests(), 2);

    // A new included file with a scenario of its own.
    let extra = "scenario \"extra\" {\n    user \"extra\"\n}\n";
    write(&shared.join("extra.kdl"), extra);
    write(&suite, &format!("include \"shared/extra.kdl\"\n{main}"));
    let lines = watch.wait_for("watch: rerun 3 done").await;
    assert!(lines.join("\n").contains("extra (new)"), "{}", watch.all());
    assert_eq!(agent.requests(), 3);

    // Its content edited.
    write(
        &shared.join("extra.kdl"),
        &extra.replace("\"extra\"\n}", "\"extra!\"\n}"),
    );
    watch.wait_for("watch: rerun 4 done").await;
    assert_eq!(last_user_messages(&agent).last().unwrap(), "extra!");

    // Renamed away: the include breaks, watch says so and stays.
    std::fs::rename(shared.join("extra.kdl"), shared.join("more.kdl")).unwrap();
    let lines = watch.wait_for("the suite is invalid").await;
    assert!(lines.join("\n").contains("not found"), "{}", watch.all());
    // The include follows the rename. A file's suite is named after it: the scenario is
    // now `more/extra`, a new one.
    write(&suite, &format!("include \"shared/more.kdl\"\n{main}"));
    let lines = watch.wait_for("watch: rerun 5 done").await;
    assert!(
        lines.join("\n").contains("more/extra (new)"),
        "{}",
        watch.all()
    );
    // Edits to the renamed file are seen.
    write(
        &shared.join("more.kdl"),
        &extra.replace("\"extra\"\n}", "\"more\"\n}"),
    );
    watch.wait_for("watch: rerun 6 done").await;
    assert_eq!(last_user_messages(&agent).last().unwrap(), "more");

    // Deleted with its include: the scenario is gone from the results, nothing is called.
    let calls = agent.requests();
    write(&suite, main);
    std::fs::remove_file(shared.join("more.kdl")).unwrap();
    let lines = watch.wait_for("watch: rerun 7 done").await;
    assert!(
        lines.join("\n").contains("0 agent calls"),
        "{}",
        watch.all()
    );
    write(&suite, &main.replace("\"base\"\n}", "\"base!\"\n}"));
    watch.wait_for("watch: rerun 8 done").await;
    assert_eq!(agent.requests(), calls + 1, "{}", watch.all());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_during_a_rerun_stops_it_and_starts_the_next() {
    let fast = MisbehavingServer::respond(200, OK_BODY).await;
    // Answers one byte at a time, for ever: a rerun that would never end by itself.
    let slow = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let fast_part = format!(
        "agent \"fast\" protocol=\"connexity\" url=\"{}\"\nscenario \"quick\" {{\n    agent \"fast\"\n    user \"hi\"\n    expect no-error\n}}\n",
        fast.url()
    );
    let slow_part = format!(
        "agent \"slow\" protocol=\"connexity\" url=\"{}\" timeout=\"120s\"\nscenario \"stuck\" {{\n    agent \"slow\"\n    user \"hi\"\n}}\n",
        slow.url()
    );
    write(&suite, &format!("{fast_part}{slow_part}"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("passed  suite/quick").await;
    // The first rerun is stuck on the slow agent; a save stops it.
    while slow.requests() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    write(&suite, &fast_part.replace("\"hi\"", "\"hello\""));
    let stopped = watch
        .wait_for("watch: rerun 1 stopped by a newer save")
        .await;
    // Both calls were made, the slow one cut off in flight: counted all the same.
    assert!(
        stopped
            .last()
            .is_some_and(|l| l.ends_with("(2 agent calls made)")),
        "{}",
        watch.all()
    );
    let lines = watch.wait_for("watch: rerun 2 done").await;
    let text = lines.join("\n");
    assert!(text.contains("1 agent call"), "{}", watch.all());
    assert_eq!(last_user_messages(&fast), ["hi", "hello"]);
}

/// An included file's directory outside the watched one, removed and put back (`rm -r`,
/// then a checkout), is watched again; so is a suite directory moved into the watched one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_that_go_and_come_back_are_watched_again() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let agents = format!(
        "agent \"a\" protocol=\"connexity\" url=\"{}\"\n",
        agent.url()
    );
    let scenario = |id: &str, message: &str| {
        format!("scenario \"{id}\" {{\n    user \"{message}\"\n    expect no-error\n}}\n")
    };
    std::fs::create_dir_all(dir.path().join("suites")).unwrap();
    std::fs::create_dir_all(dir.path().join("common")).unwrap();
    write(&dir.path().join("common/agents.kdl"), &agents);
    write(
        &dir.path().join("suites/main.kdl"),
        &format!("include \"../common/agents.kdl\"\n{}", scenario("s", "hi")),
    );
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;

    std::fs::remove_dir_all(dir.path().join("common")).unwrap();
    watch.wait_for("the suite is invalid").await;
    std::fs::create_dir_all(dir.path().join("common")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    write(&dir.path().join("common/agents.kdl"), &agents);
    watch.wait_for("valid again").await;
    // Edits of it are seen again.
    write(
        &dir.path().join("common/agents.kdl"),
        &agents.replace("protocol=", "timeout=\"9s\" protocol="),
    );
    watch.wait_for("watch: rerun 2 done").await;

    // A directory of suites moved in whole.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(elsewhere.path().join("more")).unwrap();
    write(
        &elsewhere.path().join("more/more.kdl"),
        &format!(
            "include \"../../common/agents.kdl\"\n{}",
            scenario("moved", "hello")
        ),
    );
    std::fs::rename(
        elsewhere.path().join("more"),
        dir.path().join("suites/more"),
    )
    .unwrap();
    let lines = watch.wait_for("watch: rerun 3 done").await;
    assert!(lines.join("\n").contains("more/moved"), "{}", watch.all());
}

/// A directory that appears and holds no suite file changes nothing: the reruns' own under
/// an `--out` inside the watched one (which made every rerun stop the one before, for
/// ever), or any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_directory_without_suites_reruns_nothing() {
    let agent = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::from_millis(600),
        body: OK_BODY.to_string(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("main.kdl"),
        &format!(
            "agent \"a\" protocol=\"connexity\" url=\"{}\"\nscenario \"s\" {{\n    user \"hi\"\n    expect no-error\n}}\n",
            agent.url()
        ),
    );
    // `--out runs` is inside the watched `.`.
    let mut watch = Watch::start_on(dir.path(), ".", &[]);
    watch.wait_for("watch: rerun 1 done").await;
    std::fs::create_dir_all(dir.path().join("scratch/deeper")).unwrap();
    std::fs::write(dir.path().join("scratch/deeper/notes.txt"), "x").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let all = watch.all();
    assert!(!all.contains("stopped by a newer save"), "{all}");
    assert!(!all.contains("rerun 2"), "{all}");
    assert_eq!(agent.requests(), 1, "{all}");
}

/// A signal that arrives while a newer save is stopping a rerun ends the session: the
/// rerun the save asked for does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_a_save_stops_a_rerun_ends_the_session() {
    // Answers one byte at a time, for ever: the call in flight never finishes by itself.
    let slow = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |message: &str| {
        format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\" timeout=\"120s\"\nscenario \"stuck\" {{\n    user \"{message}\"\n}}\n",
            slow.url()
        )
    };
    write(&suite, &text("hi"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1").await;
    while slow.requests() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The save stops rerun 1, whose call in flight has 2 s to finish; the signal comes
    // within them.
    write(&suite, &text("hello"));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    // Without the stop, the next rerun would wait on the slow agent for 120 s.
    let status = tokio::time::timeout(Duration::from_secs(20), watch.child.wait())
        .await
        .expect("watch did not exit after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{}", watch.all());
    assert_eq!(
        slow.requests(),
        1,
        "the next rerun called the agent: {}",
        watch.all()
    );
}

/// `latest/` holds the last finished rerun while the next one runs, and keeps it when that
/// rerun is stopped: it was cleared at a rerun's start, so a tab opened during a slow rerun
/// found no report, and Ctrl-C left `latest/` with nothing of the suites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_keeps_the_last_finished_rerun_until_the_next_finishes() {
    let slow = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let fast = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |url: &str| {
        format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{url}\" timeout=\"120s\"\n\
             scenario \"a\" {{\n    user \"hi\"\n    expect no-error\n}}\n\
             scenario \"b\" {{\n    user \"hello\"\n    expect no-error\n}}\n"
        )
    };
    write(&suite, &text(&fast.url()));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    let latest = dir.path().join("runs").join("latest");
    let summary = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap()
    };
    let before = std::fs::read(latest.join("report.html")).unwrap();
    assert_eq!(
        summary(&latest)["stats"]["aggregates"]["counts"]["passed"],
        2,
        "{}",
        watch.all()
    );

    // The agent turns slow: the rerun waits on it.
    write(&suite, &text(&slow.url()));
    while slow.requests() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(std::fs::read(latest.join("report.html")).unwrap(), before);
    assert_eq!(
        summary(&latest)["stats"]["aggregates"]["counts"]["passed"],
        2
    );

    let pid = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), watch.child.wait())
        .await
        .expect("watch did not exit after SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{}", watch.all());
    assert_eq!(std::fs::read(latest.join("report.html")).unwrap(), before);
    let kept = summary(&latest);
    assert_eq!(kept["stats"]["aggregates"]["counts"]["passed"], 2, "{kept}");
    assert!(
        !dir.path().join("runs").join(".latest.next").exists(),
        "the stopped rerun's recording is left behind"
    );
    assert!(
        watch
            .all()
            .contains("the last finished rerun stays in runs/latest"),
        "{}",
        watch.all()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_a_stopping_rerun_at_once() {
    // Answers one byte at a time, for ever: the call in flight never finishes by itself.
    let slow = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        &format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\" timeout=\"120s\"\nscenario \"stuck\" {{\n    user \"hi\"\n}}\n",
            slow.url()
        ),
    );
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1").await;
    while slow.requests() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let first = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: as above; the child has not exited (the grace period is 2 s).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(DEADLINE, watch.child.wait())
        .await
        .expect("watch did not exit")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{}", watch.all());
    // Said, as `trellis run` says it, naming the rerun's directory; no rerun had
    // finished, so there is no last one to keep.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all = watch.all();
    let named = all
        .split("stopped during the first rerun; what it finished is in ")
        .nth(1)
        .and_then(|rest| rest.split(" (marked stopped)").next())
        .unwrap_or_else(|| panic!("{all}"));
    assert!(named.starts_with("runs/"), "{all}");
    assert!(
        dir.path().join(named).join("journal.jsonl.zst").is_file(),
        "{all}"
    );
    assert!(!all.contains("the last finished rerun stays"), "{all}");
    // The first signal alone would wait out the 2 s grace period for the stuck call.
    assert!(
        first.elapsed() < Duration::from_millis(1900),
        "the second signal did not cut the grace period short: {:?}",
        first.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_the_open_tab_after_each_rerun() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    write(&suite, &branching_suite(&agent.url(), "go right", 5));
    let mut watch = Watch::start(dir.path(), &["--serve", "0"]);
    let lines = watch.wait_for("serving the latest report on http://").await;
    let url = lines
        .last()
        .and_then(|l| l.split("http://").nth(1))
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    watch.wait_for("watch: rerun 1 done").await;

    let page = http_get(&url, "/").await;
    assert!(page.contains("<html"), "{page}");
    assert!(page.contains("new EventSource(\"/events\")"), "{page}");
    // A page of another site that rebinds its name to 127.0.0.1 names itself in `Host`: it
    // gets no transcripts.
    let mut foreign = tokio::net::TcpStream::connect(&url).await.unwrap();
    foreign
        .write_all(b"GET / HTTP/1.1\r\nHost: evil.example:7357\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(DEADLINE, foreign.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    assert!(!answer.contains("<html"), "{answer}");
    // Only the served page has the script, not the report on disk.
    let run = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let on_disk = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(!on_disk.contains("EventSource"));

    // An open event stream hears `reload` once the next rerun is written.
    let mut events = tokio::net::TcpStream::connect(&url).await.unwrap();
    events
        .write_all(format!("GET /events HTTP/1.1\r\nHost: {url}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = vec![0u8; 512];
    let n = tokio::time::timeout(DEADLINE, events.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).contains("text/event-stream"));
    write(&suite, &branching_suite(&agent.url(), "go RIGHT", 5));
    let mut seen = String::new();
    let mut buf = vec![0u8; 1024];
    while !seen.contains("event: reload") {
        let n = tokio::time::timeout(DEADLINE, events.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the event stream closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    watch.wait_for("watch: rerun 2 done").await;

    // A save that does not load: the tab is told, and says so above the last report
    // (it showed the last green report as if current).
    write(&suite, "scenario \"broken\" {\n    usr \"hi\"\n}\n");
    watch.wait_for("the suite is invalid").await;
    let page = http_get(&url, "/").await;
    assert!(
        page.contains("The suites do not load since the last save"),
        "{page}"
    );
    assert!(page.contains("usr"), "the diagnostic is shown: {page}");
    assert!(!page.contains('\u{1b}'), "terminal colours in the page");
    // Valid again (as before it broke): the banner goes.
    write(&suite, &branching_suite(&agent.url(), "go RIGHT", 5));
    watch.wait_for("valid again").await;
    let page = http_get(&url, "/").await;
    assert!(!page.contains("The suites do not load"), "{page}");
}

/// The served page in a real browser (headless chromium): the open tab reloads itself
/// after a rerun, showing the new rerun's report. The page's own Content-Security-Policy
/// must let the added reload script run and connect to `/events`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reloads_a_real_browser_tab() {
    use serde_json::{Value, json};
    use tokio::task::block_in_place;
    use trellis_testkit::browser::{Browser, chromium};

    let binary = chromium();
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    write(&suite, &branching_suite(&agent.url(), "go right", 5));
    let mut watch = Watch::start(dir.path(), &["--serve", "0"]);
    let lines = watch.wait_for("serving the latest report on http://").await;
    let url = lines
        .last()
        .and_then(|l| l.split("serving the latest report on ").nth(1))
        .unwrap()
        .trim()
        .to_owned();
    watch.wait_for("watch: rerun 1 done").await;

    let is_events = |e: &Value| {
        e["params"]["response"]["url"]
            .as_str()
            .is_some_and(|u| u.ends_with("/events"))
    };
    let page_errors = |browser: &Browser| -> Vec<Value> {
        browser
            .events_named("Log.entryAdded")
            .into_iter()
            .filter(|e| e["params"]["entry"]["level"] == "error")
            .cloned()
            .collect()
    };
    let mut browser = Browser::launch(&binary);
    let first_title = block_in_place(|| {
        browser.page("Page.navigate", json!({ "url": url }));
        browser.wait_for_event("Page.loadEventFired");
        // The report's own script still runs.
        assert_eq!(
            browser.eval("document.documentElement.dataset.ready"),
            "yes"
        );
        browser.eval("window.__before_rerun = 1");
        // The reload script is listening (its stream's headers are in) before the edit,
        // so the rerun's `reload` cannot pass it by.
        let listening = browser.event_where(
            "Network.responseReceived",
            Duration::from_secs(30),
            is_events,
        );
        assert!(
            listening.is_some(),
            "the reload script never connected to /events; page errors: {:?}",
            page_errors(&browser)
        );
        browser.eval("document.title")
    });

    write(&suite, &branching_suite(&agent.url(), "go RIGHT", 5));
    watch.wait_for("watch: rerun 2 done").await;
    block_in_place(|| {
        let reloaded = browser.event_where("Page.loadEventFired", DEADLINE, |_| true);
        assert!(
            reloaded.is_some(),
            "the tab did not reload after the rerun; page errors: {:?}",
            page_errors(&browser)
        );
        assert_eq!(browser.eval("typeof window.__before_rerun"), "undefined");
        let title = browser.eval("document.title");
        assert!(
            title
                .as_str()
                .is_some_and(|t| t.starts_with("Trellis run "))
        );
        assert_ne!(title, first_title, "the tab shows the new rerun's report");
        assert_eq!(page_errors(&browser), Vec::<Value>::new());
    });
}

/// A plain HTTP/1.1 GET on a fresh connection; the body.
async fn http_get(host: &str, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(DEADLINE, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response)
}

/// A scenario that `needs` another went out of the selection; the one it needs changed its
/// conversation while it was away; it came back unchanged and was answered from the turns it
/// had recorded after the old conversation (`(back)`, no agent call). Back with `needs`, it
/// talks to the agent afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependant_back_after_what_it_needs_changed_talks_afresh() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |first: &str, status: &str| {
        format!(
            r#"agent "bot" protocol="connexity" url="{}"
scenario "setup" {{
    user "{first}"
    expect no-error
}}
scenario "after" {{
    {status}
    needs "setup"
    user "then this"
    expect no-error
}}
"#,
            agent.url()
        )
    };
    write(&suite, &text("create it", ""));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 2, "{}", watch.all());

    write(&suite, &text("create it", "status \"draft\""));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(lines.contains("removed suite/after"), "{}", watch.all());
    write(&suite, &text("create it now", "status \"draft\""));
    watch.wait_for("watch: rerun 3 done").await;
    assert_eq!(last_user_messages(&agent)[2..], ["create it now"]);

    write(&suite, &text("create it now", ""));
    let lines = watch.wait_for("watch: rerun 4 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/after (back, talking afresh after what it needs)"),
        "{}",
        watch.all()
    );
    assert_eq!(
        last_user_messages(&agent)[3..],
        ["then this"],
        "{}",
        watch.all()
    );

    // Away again while what it needs changes, and back with its checks edited: its
    // recorded turns were re-checked, not talked afresh.
    write(&suite, &text("create it now", "status \"draft\""));
    watch.wait_for("watch: rerun 5 done").await;
    write(&suite, &text("create it again", "status \"draft\""));
    watch.wait_for("watch: rerun 6 done").await;
    let calls = agent.requests();
    let edited = text("create it again", "").replace(
        "user \"then this\"\n    expect no-error",
        "user \"then this\"\n    expect turns max=9",
    );
    assert_ne!(edited, text("create it again", ""));
    write(&suite, &edited);
    let lines = watch.wait_for("watch: rerun 7 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/after (back, talking afresh after what it needs)"),
        "{}",
        watch.all()
    );
    assert_eq!(
        last_user_messages(&agent)[calls..],
        ["then this"],
        "{}",
        watch.all()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_that_need_a_changed_one_talk_to_the_agent_again() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |first: &str, max: u32| {
        format!(
            r#"agent "bot" protocol="connexity" url="{}"
scenario "setup" {{
    user "{first}"
    criteria {{
        turns max={max}
    }}
}}
scenario "after" {{
    needs "setup"
    user "then this"
}}
scenario "alone" {{
    user "unrelated"
}}
"#,
            agent.url()
        )
    };
    write(&suite, &text("create it", 5));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 3);

    // The needed scenario's conversation changed: it and its dependant call the agent.
    write(&suite, &text("create it now", 5));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/after (dependency changed: suite/setup)"),
        "{lines}"
    );
    assert!(
        lines.contains("rerun suite/setup (steps changed)"),
        "{lines}"
    );
    assert_eq!(
        last_user_messages(&agent)[3..],
        ["create it now", "then this"],
        "{}",
        watch.all()
    );

    // Only its checks: re-checked, and the dependant keeps its recorded turns.
    write(&suite, &text("create it now", 4));
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(lines.contains("0 agent calls"), "{lines}");
    assert_eq!(agent.requests(), 5);

    // Its check fails: the dependant is skipped, and is not run. Put back, the dependant
    // runs again from the turns recorded two reruns before.
    let failing = text("create it now", 4).replace("turns max=4", "reply contains=\"NOPE\"");
    write(&suite, &failing);
    watch.wait_for("watch: rerun 4 done").await;
    write(&suite, &text("create it now", 4));
    let lines = watch.wait_for("watch: rerun 5 done").await.join("\n");
    assert!(lines.contains("0 agent calls"), "{}", watch.all());
    assert_eq!(agent.requests(), 5, "{}", watch.all());

    // The dependant's own steps edited in the same save: it still talks afresh from its
    // first turn, not from its first edited step only.
    write(
        &suite,
        &text("create it again", 4).replace(
            "    user \"then this\"\n",
            "    user \"then this\"\n    user \"and that\"\n",
        ),
    );
    let lines = watch.wait_for("watch: rerun 6 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/after (dependency changed: suite/setup)"),
        "{lines}"
    );
    assert_eq!(
        last_user_messages(&agent)[5..],
        ["create it again", "then this", "and that"],
        "{}",
        watch.all()
    );
}

/// AgentScope keeps the conversation on the server: a changed branch cannot be rebuilt
/// from records, so the unchanged prefix is sent again in the branch's fresh session
/// before the changed step; the untouched branch calls nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bound_agent_hears_the_prefix_again_before_a_changed_step() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |question: &str| {
        format!(
            r#"agent "weather" protocol="agentscope" builtin="weather"
scenario "remembers" {{
    user "Hi there!"
    user "What's the weather in Paris today?"
    expect tool "get_weather" city="Paris"
    branch "second-city" {{
        user "And the forecast for Tokyo?"
        expect tool "get_weather" city="Tokyo"
    }}
    branch "recall" {{
        user "{question}"
        expect reply contains="Paris"
    }}
}}
"#
        )
    };
    write(&suite, &text("What did I ask?"));
    let mut watch = Watch::start(dir.path(), &[]);
    let lines = watch.wait_for("watch: rerun 1 done").await.join("\n");
    assert!(lines.contains("2 passed"), "{lines}");

    write(&suite, &text("What did I ask before?"));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    // The two prefix turns again, then the changed one; the agent still knows Paris.
    assert!(lines.contains("3 agent calls"), "{lines}");
    assert!(
        lines.contains("passed  suite/remembers · recall"),
        "{lines}"
    );
    assert!(!lines.contains("second-city [weather"), "{lines}");
    assert!(lines.contains("2 passed"), "{lines}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_verbose_shows_the_fingerprints_watch_compares() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let list = || async {
        let out = trellis()
            .current_dir(dir.path())
            .args(["list", "suite.kdl", "--verbose"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let url = "http://127.0.0.1:9/agent/respond";
    write(&suite, &branching_suite(url, "go right", 5));
    let before = list().await;
    assert!(before.contains("  fingerprint: conv "), "{before}");
    assert!(before.contains("  node right: conv "), "{before}");

    write(
        &suite,
        &format!(
            "// notes\n{}",
            branching_suite(url, "go right", 5).replace("    user", "  user")
        ),
    );
    assert_eq!(
        list().await,
        before,
        "comments and indentation change nothing"
    );

    write(&suite, &branching_suite(url, "go RIGHT", 5));
    let after = list().await;
    let changed: Vec<&str> = before
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.trim().split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(changed, ["fingerprint", "node right"], "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_repetitions_run_only_the_new_ones() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |repeat| repeated_suite(&agent.url(), "again", &["one", "two"], repeat);
    write(&suite, &text(2));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 4);
    write(&suite, &text(3));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert_eq!(agent.requests(), 6, "{}", watch.all());
    // Repetitions are numbered from 0, as `run` prints them and Parquet holds them: the
    // new third one is #2, and the first two did not rerun.
    assert!(lines.contains("· main [bot #2]"), "{lines}");
    assert!(!lines.contains("· main [bot #1]"), "{lines}");
    assert!(!lines.contains("· main [bot #0]"), "{lines}");
    // Said as what changed: `repeat`, not the steps.
    assert!(lines.contains("(repeat changed)"), "{lines}");
    assert!(!lines.contains("steps changed"), "{lines}");
    // The new repetition is the rerun's first result.
    assert!(lines.contains("first result after"), "{lines}");
    // Fewer: nothing runs, and the header says why the totals shrink, naming what went.
    write(&suite, &text(1));
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert_eq!(agent.requests(), 6, "{}", watch.all());
    assert!(lines.contains("(repeat changed)"), "{lines}");
    assert!(lines.contains(" repetitions #1, #2"), "{lines}");
}

/// Vim without `backupcopy`: the original is renamed to a backup, the new text written to
/// a new file of the original name, the backup deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_through_a_backup_rename_is_seen() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    write(&suite, &branching_suite(&agent.url(), "go right", 5));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    let backup = dir.path().join("suite.kdl~");
    std::fs::rename(&suite, &backup).unwrap();
    write(
        &suite,
        &branching_suite(&agent.url(), "go right", 5).replace("go left", "go west"),
    );
    std::fs::remove_file(&backup).unwrap();
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(lines.contains("1 agent call"), "{}", watch.all());
    assert_eq!(last_user_messages(&agent).last().unwrap(), "go west");
}

/// LLM judges in a watch session go through the response cache: an edit to another check
/// re-judges from the cache (no LLM call, no agent call), an edited judged check asks the
/// judge again for that check only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judges_rerun_through_the_cache_and_only_an_edited_one_asks_again() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let verdict =
        Reply::text(r#"{"score": 0.9, "label": "pass", "justification": "polite enough"}"#);
    let judge = FakeLlm::start(vec![Rule::otherwise(vec![verdict; 10])]).await;
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |greeting_check: &str, reply_check: &str| {
        format!(
            "provider \"fake\" kind=\"openai\" base-url=\"{}\" model=\"judge-m\"\n\
             judge \"polite\" provider=\"fake\"\n\
             agent \"bot\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"a\" {{\n    user \"hello\"\n    expect judge \"{greeting_check}\" judge=\"polite\"\n    \
             expect reply contains=\"{reply_check}\"\n}}\n\
             scenario \"b\" {{\n    user \"bye\"\n    expect judge \"The agent says goodbye\" judge=\"polite\"\n}}\n",
            judge.base_url(),
            agent.url()
        )
    };
    write(&suite, &text("The agent greets back", "Hello"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!((agent.requests(), judge.calls()), (2, 2), "{}", watch.all());

    // Another check of scenario a: both judges answered from the cache.
    write(&suite, &text("The agent greets back", "Hell"));
    watch.wait_for("watch: rerun 2 done").await;
    assert_eq!((agent.requests(), judge.calls()), (2, 2), "{}", watch.all());

    // The judged check itself: one new question to the judge, still no agent call.
    write(&suite, &text("The agent greets the user back", "Hell"));
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert_eq!((agent.requests(), judge.calls()), (2, 3), "{}", watch.all());
    assert!(lines.contains("0 agent call"), "{lines}");
}

/// `latest/` holds the whole state, its LLM use included: after a checks-only rerun, the
/// model agent's calls of the turns it reused are still counted (they were dropped:
/// `llm_roles` empty beside the turns and tokens of every trajectory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_counts_the_llm_calls_of_the_turns_it_reused() {
    use super::support::llm::{FakeLlm, Reply, Rule};
    let model = FakeLlm::start(vec![Rule::otherwise(vec![Reply::text("Hello there"); 10])]).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |check: &str| {
        format!(
            "agent \"bot\" protocol=\"openai\" base-url=\"{}\" model=\"m\"\n\
             scenario \"a\" {{\n    user \"hello\"\n    expect reply contains=\"{check}\"\n}}\n",
            model.base_url()
        )
    };
    let roles = || -> serde_json::Value {
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("runs/latest/summary.json")).unwrap(),
        )
        .unwrap();
        summary["stats"]["aggregates"]["llm_roles"].clone()
    };
    write(&suite, &text("Hello"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(model.calls(), 1, "{}", watch.all());
    let first = roles();
    assert_eq!(first["agent"]["calls"], 1, "{first}");
    write(&suite, &text("Hell"));
    watch.wait_for("watch: rerun 2 done").await;
    assert_eq!(model.calls(), 1, "checks only: {}", watch.all());
    assert_eq!(roles()["agent"], first["agent"], "{}", roles());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_dataset_row_reruns_only_its_instance() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let rows = dir.path().join("data/d.csv");
    write(&rows, "id,q\na,hello\nb,book please\n");
    write(
        &dir.path().join("suite.kdl"),
        &format!(
            "agent \"x\" protocol=\"connexity\" url=\"{}\"\n\
             dataset \"d\" path=\"data/d.csv\"\n\
             scenario \"s\" for-each=\"d\" {{\n    row-id \"{{{{ row.id }}}}\"\n    user \"{{{{ row.q }}}}\"\n    expect no-error\n}}\n",
            agent.url()
        ),
    );
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 2);

    // The dataset is watched like the suite: one row edited, one instance talks again.
    write(&rows, "id,q\na,hello\nb,book it now\n");
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(lines.contains("data/d.csv changed"), "{lines}");
    assert!(
        lines.contains("rerun suite/s[b]") && !lines.contains("rerun suite/s[a]"),
        "{lines}"
    );
    assert_eq!(agent.requests(), 3, "{}", watch.all());
    assert_eq!(
        last_user_messages(&agent).last().map(String::as_str),
        Some("book it now")
    );
}

/// A rerun against an agent whose accept queue overflowed says so under its footer; the
/// next rerun, on connections already made, does not repeat what the first one saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_accept_queue_is_named_under_the_rerun_it_slowed() {
    let agent = MisbehavingServer::overflowing(Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |repeat| repeated_suite(&agent.url(), "queue", &["one"], repeat);
    write(&suite, &text(8));
    let mut watch = Watch::start(dir.path(), &["--jobs", "8"]);
    watch.wait_for("watch: rerun 1 done").await;
    let notice = watch
        .wait_for(&format!("BACKLOG {} dropped", agent.addr))
        .await;
    assert_eq!(notice.len(), 1, "right under the footer: {}", watch.all());
    write(&suite, &text(9));
    watch.wait_for("watch: rerun 2 done").await;
    assert_eq!(agent.requests(), 9, "{}", watch.all());
    // Give a second notice the time the first one took to show, then check it did not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all = watch.all();
    assert_eq!(all.matches("BACKLOG").count(), 1, "{all}");
}

/// A `spans #true` agent's spans are collected under watch as under `run` (its tool checks
/// read them), and a turn answered again from the records keeps the spans the agent sent
/// then, without waiting for new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spans_agents_spans_are_collected_and_kept_for_reused_turns() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = std::fs::read_to_string(repo("suites/opentelemetry.kdl")).unwrap();
    write(&suite, &text);
    let mut watch = Watch::start(dir.path(), &[]);
    let lines = watch.wait_for("watch: rerun 1 done").await.join("\n");
    assert!(lines.contains("1 passed"), "{}", watch.all());

    // Checks alone: both turns are reused, and their span and tool checks still pass.
    write(&suite, &text.replace(r#"max="2s""#, r#"max="3s""#));
    let done = watch.wait_for("watch: rerun 2 done").await;
    let lines = done.join("\n");
    assert!(
        lines.contains("1 passed") && lines.contains("0 agent calls, 2 turns reused"),
        "{}",
        watch.all()
    );
    // A reused turn sends nothing, so it must not wait for spans (five seconds a turn).
    let took: u64 = done
        .last()
        .and_then(|l| l.split("done in ").nth(1))
        .and_then(|l| l.split(" ms").next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {lines}"));
    assert!(took < 5_000, "{}", watch.all());

    // The second step changed: its turn goes to the agent, whose spans are read again.
    write(
        &suite,
        &text
            .replace("Please refund A-17", "Please refund A-18")
            .replace(r#"order="A-17""#, r#"order="A-18""#),
    );
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(
        lines.contains("1 passed") && lines.contains("1 agent call, 1 turn reused"),
        "{}",
        watch.all()
    );
}

/// `--otlp-receiver` on a taken port is a usage error at once, naming the address, as for
/// `trellis run`: watch does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_otlp_receiver_port_ends_watch_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        &std::fs::read_to_string(repo("suites/opentelemetry.kdl")).unwrap(),
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let o = tokio::time::timeout(
        DEADLINE,
        trellis()
            .current_dir(dir.path())
            .args(["watch", "suite.kdl", "--out", "runs", "--otlp-receiver"])
            .arg(format!("127.0.0.1:{port}"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("watch kept running")
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains(&format!("cannot listen for OTLP spans on 127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
}

/// A one-scenario suite against `url` (`users`: its user steps, then a reply check),
/// watched in `dir` through its first run and an edit of its check alone, which answers
/// every turn from the records. The watch, and `latest/`'s journal after the edit.
async fn watched_through_a_check_edit(dir: &Path, url: &str, users: &str) -> (Watch, String) {
    let suite = dir.join("suite.kdl");
    let text = |contains: &str| {
        format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{url}\"\n\
             scenario \"talk\" {{\n    {users}\n    expect reply contains=\"{contains}\"\n}}\n"
        )
    };
    write(&suite, &text("Hello"));
    let mut watch = Watch::start(dir, &[]);
    watch.wait_for("watch: rerun 1 done").await;
    write(&suite, &text("there"));
    watch.wait_for("watch: rerun 2 done").await;
    let latest = crate::journal_text(&dir.join("runs/latest"));
    (watch, latest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_trajectory_keeps_the_duration_its_turns_took() {
    let agent = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::from_millis(60),
        body: OK_BODY.to_owned(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (watch, latest) = watched_through_a_check_edit(
        dir.path(),
        &agent.url(),
        "user \"hello\"\n    user \"again\"",
    )
    .await;
    assert_eq!(agent.requests(), 2, "{}", watch.all());
    assert!(latest.contains("\"reused\":true"), "{latest}");
    let durations: Vec<f64> = latest
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e.get("trajectory")?["duration_ms"].as_f64())
        .collect();
    let [duration] = durations[..] else {
        panic!("one trajectory in latest/: {latest}")
    };
    // Two turns of at least 60 ms each, not the microseconds of reading the records.
    assert!(duration >= 120.0, "duration_ms {duration}: {latest}");
}

/// A turn that waited out a rate limit when it was called: answered from the records, its
/// trajectory keeps the wait in its duration, and the turn itself takes no time of the
/// rerun (so `latest/`'s JUnit and timeline stay within the rerun's wall time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_turn_keeps_its_wait_in_the_duration_and_takes_no_time_itself() {
    let agent = MisbehavingServer::start(Behavior::RateLimited {
        times: 1,
        retry_after: Some("1".into()),
        body: "slow down".into(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (watch, latest) =
        watched_through_a_check_edit(dir.path(), &agent.url(), "user \"hello\"").await;
    assert_eq!(agent.requests(), 2, "{}", watch.all());
    let entries: Vec<serde_json::Value> = latest
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let duration = entries
        .iter()
        .find_map(|e| e.get("trajectory")?["duration_ms"].as_f64())
        .unwrap_or_else(|| panic!("no trajectory in latest/: {latest}"));
    assert!(duration >= 1000.0, "duration_ms {duration}: {latest}");
    let turn = entries
        .iter()
        .find_map(|e| e.get("node")?["turns"].get(0).cloned())
        .unwrap_or_else(|| panic!("no turn in latest/: {latest}"));
    assert_eq!(turn["reused"], true, "{turn}");
    assert_eq!(turn["ended_ms"], turn["started_ms"], "{turn}");
}

#[tokio::test]
async fn a_run_in_latest_is_never_overwritten_by_watch() {
    let dir = tempfile::tempdir().unwrap();
    // `run` refuses the name watch keeps its state under.
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "-q", "--out", "runs/latest"])
        .arg(repo("suites/booking.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("trellis watch"), "{}", stderr(&o));
    // A run put there anyway (renamed by hand) stops watch before it writes anything.
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "-q", "--out", "runs/mine"])
        .arg(repo("suites/booking.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "asks-price fails on purpose");
    std::fs::rename(dir.path().join("runs/mine"), dir.path().join("runs/latest")).unwrap();
    let journal = std::fs::read(dir.path().join("runs/latest").join(crate::JOURNAL)).unwrap();
    let o = tokio::time::timeout(
        Duration::from_secs(60),
        trellis()
            .current_dir(dir.path())
            .arg("watch")
            .arg(repo("suites/booking.kdl"))
            .output(),
    )
    .await
    .expect("watch refused at once")
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("holds run"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(dir.path().join("runs/latest").join(crate::JOURNAL)).unwrap(),
        journal
    );
}

#[tokio::test]
async fn a_second_watch_of_the_same_out_is_refused() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        &repeated_suite(&server.url(), "s", &["hi"], 1),
    );
    let mut first = Watch::start(dir.path(), &[]);
    first.wait_for("watch: rerun 1 done").await;
    let o = tokio::time::timeout(
        Duration::from_secs(60),
        trellis()
            .current_dir(dir.path())
            .args(["watch", "suite.kdl", "--out", "runs"])
            .output(),
    )
    .await
    .expect("refused at once")
    .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("another trellis is writing to"),
        "{}",
        stderr(&o)
    );
    // The first goes on.
    assert!(first.child.try_wait().unwrap().is_none(), "{}", first.all());
}

/// A suites directory removed and brought back (`git checkout` of a branch without it and
/// back): the kernel dropped the watch with the directory, and watch must watch it again,
/// not go quiet for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suites_directory_removed_and_brought_back_is_watched_again() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir(&suites).unwrap();
    let good = branching_suite(&agent.url(), "go right", 5);
    write(&suites.join("suite.kdl"), &good);
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;

    let away = dir.path().join("away");
    std::fs::rename(&suites, &away).unwrap();
    watch.wait_for("the last results stay").await;
    std::fs::rename(&away, &suites).unwrap();
    // Back as it was: valid again.
    watch.wait_for("valid again").await;
    // And an edit inside it is seen.
    write(
        &suites.join("suite.kdl"),
        &good.replace("go left", "go west"),
    );
    watch.wait_for("watch: rerun 2 done").await;
    assert_eq!(last_user_messages(&agent).last().unwrap(), "go west");

    // Removed and created anew, files and all.
    std::fs::remove_dir_all(&suites).unwrap();
    watch.wait_for("the last results stay").await;
    std::fs::create_dir(&suites).unwrap();
    write(
        &suites.join("suite.kdl"),
        &good.replace("go left", "go east"),
    );
    watch.wait_for("watch: rerun 3 done").await;
    assert_eq!(last_user_messages(&agent).last().unwrap(), "go east");
}

/// A trajectory that is `error` because a check's evaluator failed (a judge that cannot be
/// reached), not because of a fault: watch says why under it, as `run` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_a_check_is_explained_under_its_trajectory() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let (_held, port) = super::refused_port();
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        &format!(
            "agent \"bot\" protocol=\"connexity\" url=\"{}\"\n\
             provider \"p\" kind=\"openai\" base-url=\"http://127.0.0.1:{port}/v1\" model=\"m\" retries=0\n\
             scenario \"judged\" {{\n    agent \"bot\"\n    user \"hi\"\n    criteria {{\n        \
             judge \"GOOD answer\"\n    }}\n}}\n",
            agent.url()
        ),
    );
    let mut watch = Watch::start(dir.path(), &[]);
    let lines = watch.wait_for("watch: rerun 1 done").await.join("\n");
    assert!(lines.contains("error judge"), "{lines}");
    assert!(lines.contains("GOOD answer"), "{lines}");
}

/// A directory of suites moved out of the watched one (`mv suites/extra ../away`) takes its
/// scenarios out of the results, and moved back brings them in: the kernel reports only the
/// directory's own rename, not one event per file it holds, as `rm -r` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_suites_moved_out_and_back_is_seen_both_ways() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir_all(suites.join("extra")).unwrap();
    write(
        &suites.join("main.kdl"),
        &repeated_suite(&agent.url(), "kept", &["hi"], 1),
    );
    write(
        &suites.join("extra/extra.kdl"),
        "scenario \"moving\" {\n    user \"hello\"\n}\n",
    );
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;

    let away = dir.path().join("extra-away");
    std::fs::rename(suites.join("extra"), &away).unwrap();
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("watch: rerun 2: suites/extra changed"),
        "{}",
        watch.all()
    );
    assert!(lines.contains("removed extra/moving"), "{}", watch.all());
    let (trajectories, _) = journal(&dir.path().join("runs/latest"));
    assert_eq!(trajectories, ["main/kept/main"], "{}", watch.all());

    std::fs::rename(&away, suites.join("extra")).unwrap();
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(lines.contains("rerun extra/moving"), "{}", watch.all());
    let (trajectories, _) = journal(&dir.path().join("runs/latest"));
    assert_eq!(
        trajectories,
        ["extra/moving/main", "main/kept/main"],
        "{}",
        watch.all()
    );
}

/// A rerun reruns what changed since the last finished rerun, and its header names those
/// files: not only the save that started it, after a broken save or a rerun a save stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_names_every_file_changed_since_the_last_finished_rerun() {
    let fast = MisbehavingServer::respond(200, OK_BODY).await;
    // Answers one byte at a time, for ever: a rerun that would never end by itself.
    let slow = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir(&suites).unwrap();
    let a = |message: &str| {
        format!(
            "agent \"fast\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"slow\" protocol=\"connexity\" url=\"{}\" timeout=\"120s\"\n\
             scenario \"one\" {{\n    agent \"fast\"\n    user \"{message}\"\n    expect no-error\n}}\n",
            fast.url(),
            slow.url()
        )
    };
    let b = |agent: &str, message: &str| {
        format!(
            "scenario \"two\" {{\n    agent \"{agent}\"\n    user \"{message}\"\n    expect no-error\n}}\n"
        )
    };
    write(&suites.join("a.kdl"), &a("hi"));
    write(&suites.join("b.kdl"), &b("fast", "hi"));
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;

    // a.kdl broken, then b.kdl edited while it is (invalid still), then a.kdl mended: the
    // rerun covers b.kdl's edit.
    atomic_write(&suites.join("a.kdl"), &a("hi").replace("\"hi\"", "\"hi"));
    watch.wait_for("the suite is invalid").await;
    atomic_write(&suites.join("b.kdl"), &b("fast", "hello"));
    watch.wait_for("the suite is invalid").await;
    atomic_write(&suites.join("a.kdl"), &a("hi"));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("watch: rerun 2: suites/a.kdl and suites/b.kdl changed"),
        "{}",
        watch.all()
    );
    assert!(
        lines.contains("rerun b/two (steps changed)"),
        "{}",
        watch.all()
    );

    // b.kdl's scenario now waits on the slow agent; a save to a.kdl stops that rerun, and
    // the next one still covers b.kdl.
    atomic_write(&suites.join("b.kdl"), &b("slow", "hello"));
    watch.wait_for("watch: rerun 3:").await;
    while slow.requests() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    atomic_write(&suites.join("a.kdl"), &a("hello"));
    watch
        .wait_for("watch: rerun 3 stopped by a newer save")
        .await;
    let lines = watch.wait_for("watch: rerun 4:").await.join("\n");
    assert!(
        lines.contains("watch: rerun 4: suites/a.kdl and suites/b.kdl changed"),
        "{}",
        watch.all()
    );
}

/// A scenario that goes and comes back as it was (a save in two writes, `git stash` and
/// `stash pop`, a file deleted and put back, a scenario made a draft and active again)
/// reuses the turns recorded before it went: the agent is not called again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_that_goes_and_comes_back_unchanged_reuses_its_turns() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir(&suites).unwrap();
    let main = repeated_suite(&agent.url(), "kept", &["hi"], 1);
    let going =
        "scenario \"going\" {\n    user \"bye\"\n    user \"and more\"\n    expect no-error\n}\n";
    write(&suites.join("main.kdl"), &format!("{main}{going}"));
    let other = "scenario \"other\" {\n    user \"other\"\n    expect no-error\n}\n";
    write(&suites.join("other.kdl"), other);
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;
    let calls = agent.requests();
    assert_eq!(calls, 4, "{}", watch.all());

    // Gone from its file, then back.
    write(&suites.join("main.kdl"), &main);
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(lines.contains("removed main/going"), "{}", watch.all());
    write(&suites.join("main.kdl"), &format!("{main}{going}"));
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(lines.contains("rerun main/going (back)"), "{}", watch.all());
    assert!(lines.contains("0 agent calls"), "{}", watch.all());
    assert_eq!(agent.requests(), calls, "{}", watch.all());
    // `latest/` has it whole, from the records.
    let latest = crate::journal_text(&dir.path().join("runs/latest"));
    let going_turns = latest
        .lines()
        .filter(|l| l.contains("\"user_message\":\"bye\"") && l.contains("\"reused\":true"))
        .count();
    assert_eq!(going_turns, 1, "{latest}");

    // Its file deleted, then put back.
    std::fs::remove_file(suites.join("other.kdl")).unwrap();
    let lines = watch.wait_for("watch: rerun 4 done").await.join("\n");
    assert!(lines.contains("removed other/other"), "{}", watch.all());
    write(&suites.join("other.kdl"), other);
    let lines = watch.wait_for("watch: rerun 5 done").await.join("\n");
    assert!(
        lines.contains("rerun other/other (back)"),
        "{}",
        watch.all()
    );
    assert_eq!(agent.requests(), calls, "{}", watch.all());

    // Out of the selection (a draft), then back in.
    let draft = other.replace("{\n", "{\n    status \"draft\"\n");
    write(&suites.join("other.kdl"), &draft);
    let lines = watch.wait_for("watch: rerun 6 done").await.join("\n");
    assert!(lines.contains("removed other/other"), "{}", watch.all());
    write(&suites.join("other.kdl"), other);
    let lines = watch.wait_for("watch: rerun 7 done").await.join("\n");
    assert!(
        lines.contains("rerun other/other (back)"),
        "{}",
        watch.all()
    );
    assert_eq!(agent.requests(), calls, "{}", watch.all());

    // Back with a changed step: only the changed turn calls the agent.
    write(&suites.join("main.kdl"), &main);
    watch.wait_for("watch: rerun 8 done").await;
    write(
        &suites.join("main.kdl"),
        &format!("{main}{}", going.replace("and more", "and less")),
    );
    let lines = watch.wait_for("watch: rerun 9 done").await.join("\n");
    assert!(
        lines.contains("rerun main/going (steps changed)"),
        "{}",
        watch.all()
    );
    assert_eq!(last_user_messages(&agent)[calls..], ["and less"]);
}

/// `rm -r` of a big directory under a watched root (a build's, a cache's) is one event per
/// file. Telling which of them held loaded files must not cost every event a walk of every
/// loaded file: the save after it reruns promptly, and a signal during the flood ends the
/// session promptly. Many loaded files (draft scenarios, out of the selection, cost no
/// agent call) times many deleted ones took minutes of CPU in a debug build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_deleted_files_delays_neither_a_rerun_nor_a_signal() {
    const LOADED: usize = 6_000;
    const JUNK: usize = 20_000;
    // Generous: the point is that it does not grow with events × loaded files.
    const PROMPT: Duration = Duration::from_secs(10);
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suites = dir.path().join("suites");
    std::fs::create_dir(&suites).unwrap();
    write(
        &suites.join("main.kdl"),
        &repeated_suite(&agent.url(), "kept", &["hi"], 1),
    );
    for i in 0..LOADED {
        write(
            &suites.join(format!("draft{i}.kdl")),
            &format!("scenario \"draft{i}\" {{\n    status \"draft\"\n    user \"x\"\n}}\n"),
        );
    }
    let junk = |name: &str| {
        let junk = suites.join(name);
        std::fs::create_dir(&junk).unwrap();
        for i in 0..JUNK {
            write(&junk.join(format!("{i}.tmp")), "");
        }
        junk
    };
    let (first, second) = (junk("junk"), junk("more-junk"));
    let mut watch = Watch::start_on(dir.path(), "suites", &[]);
    watch.wait_for("watch: rerun 1 done").await;

    std::fs::remove_dir_all(&first).unwrap();
    write(
        &suites.join("new.kdl"),
        "scenario \"added\" {\n    user \"hello\"\n}\n",
    );
    let saved = std::time::Instant::now();
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        saved.elapsed() < PROMPT,
        "the rerun came {:?} after the save: {}",
        saved.elapsed(),
        watch.all()
    );
    assert!(lines.contains("rerun new/added (new)"), "{}", watch.all());

    std::fs::remove_dir_all(&second).unwrap();
    // Once the events have been taken in (the files have been quiet for the debounce), in
    // the middle of telling them apart.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let signalled = std::time::Instant::now();
    let status = tokio::time::timeout(DEADLINE, watch.child.wait())
        .await
        .expect("watch did not exit after SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{}", watch.all());
    assert!(
        signalled.elapsed() < PROMPT,
        "watch took {:?} to stop: {}",
        signalled.elapsed(),
        watch.all()
    );
}

/// On a terminal a rerun redraws the screen and ends with the failures that did not rerun: the
/// first twenty in order, and how many more, not thousands of lines that scroll the rerun
/// itself out of sight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_lists_twenty_standing_failures_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let scenarios = |first: &str| {
        let mut text = String::from("agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n");
        for i in 0..25 {
            let user = if i == 0 { first } else { "hello" };
            text.push_str(&format!(
                "scenario \"s{i:02}\" {{\n    user \"{user}\"\n    expect reply contains=\"never said\"\n}}\n"
            ));
        }
        text
    };
    write(&suite, &scenarios("hello"));
    let mut watch = Watch::start_on_terminal(dir.path(), 40);
    watch.wait_for("watch: rerun 1 done").await;
    atomic_write(&suite, &scenarios("hello again"));
    watch.wait_for("watch: rerun 2 done").await;
    let listed = watch.wait_for("more (in order").await;
    let standing: Vec<&String> = listed
        .iter()
        .skip_while(|l| !l.contains("still failing (unchanged):"))
        .skip(1)
        .filter(|l| l.contains("failed  suite/s"))
        .collect();
    let expected: Vec<String> = (1..21).map(|i| format!("suite/s{i:02} ")).collect();
    assert_eq!(standing.len(), 20, "{}", watch.all());
    for ((line, scenario), i) in standing.iter().zip(&expected).zip(1..) {
        assert!(line.contains(scenario.as_str()), "{line} for {scenario}");
        // Each names the line its failed check is written on.
        let site = format!(
            "reply contains=\"never said\"  (suite.kdl:{}:12):",
            4 + 4 * i
        );
        assert!(line.contains(&site), "{line}: no {site}");
    }
    // A scenario that reran says it too.
    assert!(
        watch
            .all()
            .contains("failed turn 0: reply contains=\"never said\"  (suite.kdl:4:12): "),
        "{}",
        watch.all()
    );
    let more = listed.last().unwrap();
    assert!(more.contains("… and 4 more"), "{more}");
    assert!(more.contains("latest/report.html"), "{more}");
}

/// On a terminal every redraw says where the report is served: the line that said it at
/// the start is cleared with the screen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_keeps_the_served_address_in_sight() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |user: &str| {
        format!(
            "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n\
             scenario \"s\" {{\n    user \"{user}\"\n    expect no-error\n}}\n"
        )
    };
    write(&suite, &text("hello"));
    let mut watch = Watch::start_on_terminal_with(dir.path(), 40, &["--serve", "0"]);
    watch.wait_for("watch: rerun 1 done").await;
    watch
        .wait_for("watch: the latest report is served on http://127.0.0.1:")
        .await;
    atomic_write(&suite, &text("hello again"));
    watch.wait_for("watch: rerun 2 done").await;
    watch
        .wait_for("watch: the latest report is served on http://127.0.0.1:")
        .await;
}

/// A branching scenario away from one rerun (its file emptied by an editor's save) and back
/// with one branch edited: the other branch is answered from its records and said `(back)`;
/// it was said `(new)`, though no agent was called for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_back_unchanged_beside_an_edited_one_is_said_back() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = |second: &str| {
        format!(
            r#"agent "bot" protocol="connexity" url="{}"
scenario "forks" {{
    agent "bot"
    user "hello"
    branch "kept" {{
        user "first"
    }}
    branch "edited" {{
        user "{second}"
    }}
    expect no-error
}}
"#,
            agent.url()
        )
    };
    write(&suite, &text("second"));
    // Another file, so that the directory still holds a suite while this one is empty.
    write(
        &dir.path().join("other.kdl"),
        &format!(
            "agent \"b2\" protocol=\"connexity\" url=\"{}\"\nscenario \"other\" {{\n    \
             agent \"b2\"\n    user \"x\"\n    expect no-error\n}}\n",
            agent.url()
        ),
    );
    let mut watch = Watch::start_on(dir.path(), ".", &[]);
    watch.wait_for("watch: rerun 1 done").await;
    write(&suite, "");
    watch.wait_for("watch: rerun 2 done").await;
    write(&suite, &text("second, edited"));
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(
        lines.contains("suite/forks · kept [bot #0]") && lines.contains("(back)"),
        "{}",
        watch.all()
    );
    assert!(!lines.contains("(new)"), "{}", watch.all());
}

/// A session that starts on a broken suite has no results to keep, and says so (it said
/// "the last results stay" of results there were none of).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_started_broken_says_nothing_has_run() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        "scenario \"s\" {\n    usr \"hi\"\n}\n",
    );
    let mut watch = Watch::start(dir.path(), &[]);
    let lines = watch.wait_for("the suite is invalid").await.join("\n");
    assert!(lines.contains("nothing has run yet"), "{}", watch.all());
    assert!(!lines.contains("the last results stay"), "{}", watch.all());
    let pid = i32::try_from(watch.child.id().unwrap()).unwrap();
    // SAFETY: kill(2) on a child process id this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(20), watch.child.wait())
        .await
        .expect("watch did not exit after SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{}", watch.all());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        watch
            .all()
            .contains("no rerun had finished, so there are no results"),
        "{}",
        watch.all()
    );
    // Nothing ran: the session leaves no empty `runs/latest/` (nor `runs/`) behind, which
    // read as the results of a session.
    assert!(!dir.path().join("runs").exists(), "{}", watch.all());
}

/// `--serve` on a port that is taken ends watch before it starts (exit 2), leaving no empty
/// `runs/latest/` behind, as if a session had run there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_serve_port_leaves_no_runs_directory() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect no-error\n}\n",
    );
    let o = trellis()
        .current_dir(dir.path())
        .args(["watch", "suite.kdl", "--out", "runs", "--serve", &port])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot serve on 127.0.0.1:"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("runs").exists(), "runs/ was left behind");
    drop(taken);
}

/// An agent that was down when watch started (forgotten, still building) is asked again by
/// the next save, whatever it changed: a save that changed nothing reran nothing, and only
/// an edit of the scenario itself reached the agent once it was up (docs/watch.md: "the next
/// rerun asks it again").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_was_down_is_asked_again_by_the_next_save() {
    let (held, port) = super::refused_port();
    let url = format!("http://127.0.0.1:{port}/agent/respond");
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    let text = repeated_suite(&url, "down", &["hello"], 1);
    write(&suite, &text);
    let mut watch = Watch::start(dir.path(), &[]);
    let first = watch.wait_for("watch: rerun 1 done").await.join("\n");
    assert!(first.contains("connect"), "{first}");

    // The agent comes up on its address; the suite is saved as it was.
    drop(held);
    let agent = MisbehavingServer::start_at(
        ([127, 0, 0, 1], port).into(),
        Behavior::Respond {
            status: 200,
            body: OK_BODY.to_owned(),
        },
    )
    .await;
    write(&suite, &text);
    let second = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        second.contains("its agent was not reached last time: asked again"),
        "{second}"
    );
    assert_eq!(agent.requests(), 1, "{}", watch.all());
    assert!(!second.contains("connect"), "answered now: {second}");
    assert!(second.contains("1 agent call"), "{second}");
}

/// An edited mock makes only the turns that called its tool talk to the agent again:
/// the agent is never told what a tool answers, so a scenario that did not call it is
/// unchanged, and so is what needs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_mock_reruns_only_the_turns_that_called_its_tool() {
    let calls_lookup = r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"found"},{"role":"assistant","content":"Found it."}]}"#;
    let caller = MisbehavingServer::respond(200, calls_lookup).await;
    let other = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = |lookup: &str, weather: &str| {
        format!(
            "agent \"caller\" protocol=\"connexity\" url=\"{}\"\n\
             agent \"other\" protocol=\"connexity\" url=\"{}\"\n\
             tool \"lookup\" {{\n    mock returns=#\"{{\"status\": \"{lookup}\"}}\"#\n}}\n\
             tool \"weather\" {{\n    mock returns=#\"{{\"sky\": \"{weather}\"}}\"#\n}}\n\
             scenario \"calls\" {{\n    agent \"caller\"\n    user \"find it\"\n    user \"and again\"\n    expect no-error\n}}\n\
             scenario \"talks\" {{\n    agent \"other\"\n    user \"hello\"\n    expect no-error\n}}\n\
             scenario \"after\" {{\n    agent \"other\"\n    needs \"talks\"\n    user \"then\"\n    expect no-error\n}}\n\
             scenario \"both\" {{\n    agents \"caller\" \"other\"\n    user \"either\"\n    expect no-error\n}}\n",
            caller.url(),
            other.url()
        )
    };
    write(&dir.path().join("suite.kdl"), &suite("found", "clear"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!((caller.requests(), other.requests()), (3, 3));

    // A tool no turn called: nothing reruns (the next rerun is the one below).
    write(&dir.path().join("suite.kdl"), &suite("found", "rain"));
    // The tool the caller called in its first turn: that turn and the next talk again,
    // the other scenarios not, and are not listed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    write(&dir.path().join("suite.kdl"), &suite("missing", "rain"));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/calls (a tool's answers changed"),
        "{lines}"
    );
    assert!(
        !lines.contains("suite/talks") && !lines.contains("suite/after"),
        "{lines}"
    );
    // Of a scenario run against both agents, the agent that called no tool made no call
    // and is not shown.
    assert!(lines.contains("suite/both · main [caller #0]"), "{lines}");
    assert!(!lines.contains("suite/both · main [other #0]"), "{lines}");
    assert_eq!(
        (caller.requests(), other.requests()),
        (6, 3),
        "{}",
        watch.all()
    );

    // A tool's declaration is what the agent is told: every scenario talks afresh.
    write(
        &dir.path().join("suite.kdl"),
        &suite("missing", "rain").replace(
            "tool \"weather\" {",
            "tool \"weather\" {\n    description \"the sky\"",
        ),
    );
    let lines = watch.wait_for("watch: rerun 3 done").await.join("\n");
    assert!(lines.contains("setup changed"), "{lines}");
    assert_eq!(
        (caller.requests(), other.requests()),
        (9, 6),
        "{}",
        watch.all()
    );
}

/// Enter reruns every scenario afresh: the way to see a change to the agent itself, which
/// no suite file shows (a save reuses every unchanged turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_reruns_every_scenario_afresh() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("suite.kdl"),
        &format!(
            "agent \"x\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"a\" {{\n    user \"one\"\n    user \"two\"\n    expect no-error\n}}\n\
             scenario \"b\" {{\n    user \"three\"\n    expect no-error\n}}\n",
            agent.url()
        ),
    );
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    assert_eq!(agent.requests(), 3);

    watch.press_enter().await;
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("Enter pressed: every scenario talks to its agent afresh"),
        "{lines}"
    );
    assert!(
        lines.contains("rerun suite/a (asked to talk afresh)"),
        "{lines}"
    );
    assert!(lines.contains("3 agent calls"), "{lines}");
    assert_eq!(agent.requests(), 6, "{}", watch.all());

    // A line that is not UTF-8 (a stray key's bytes) asks for a rerun too, and the reader
    // goes on.
    watch.type_line(b"\xff\xfe\n").await;
    watch.wait_for("watch: rerun 3 done").await;
    assert_eq!(agent.requests(), 9, "{}", watch.all());
    watch.press_enter().await;
    watch.wait_for("watch: rerun 4 done").await;
    assert_eq!(agent.requests(), 12, "{}", watch.all());

    // Then a save reuses what that rerun recorded, as after any other.
    write(
        &dir.path().join("suite.kdl"),
        &std::fs::read_to_string(dir.path().join("suite.kdl"))
            .unwrap()
            .replace("\"three\"", "\"four\""),
    );
    watch.wait_for("watch: rerun 5 done").await;
    assert_eq!(agent.requests(), 13, "{}", watch.all());
}

/// `dependency changed: …` names the needs that make a dependant talk afresh: not one
/// whose checks alone changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependency_changed_names_only_the_needs_that_talked_afresh() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = |a_max: u32, b_says: &str| {
        format!(
            "agent \"x\" protocol=\"connexity\" url=\"{}\"\n\
             scenario \"a\" {{\n    user \"one\"\n    criteria {{\n        turns max={a_max}\n    }}\n}}\n\
             scenario \"b\" {{\n    user \"{b_says}\"\n    expect no-error\n}}\n\
             scenario \"d\" {{\n    needs \"a\" \"b\"\n    user \"then\"\n    expect no-error\n}}\n",
            agent.url()
        )
    };
    write(&dir.path().join("suite.kdl"), &suite(5, "two"));
    let mut watch = Watch::start(dir.path(), &[]);
    watch.wait_for("watch: rerun 1 done").await;
    write(&dir.path().join("suite.kdl"), &suite(4, "three"));
    let lines = watch.wait_for("watch: rerun 2 done").await.join("\n");
    assert!(
        lines.contains("rerun suite/d (dependency changed: suite/b)"),
        "{lines}"
    );
}

/// What `trellis check` warns of is shown by watch too, when it changes: a typo that
/// still loads (a check naming a tool the suites do not declare) is not silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warnings_of_check_are_shown_as_they_change() {
    let agent = MisbehavingServer::respond(200, OK_BODY).await;
    let dir = tempfile::tempdir().unwrap();
    let suite = |tool: &str| {
        format!(
            "agent \"x\" protocol=\"connexity\" url=\"{}\"\n\
             tool \"refund\" {{\n    mock returns=\"ok\"\n}}\n\
             scenario \"s\" {{\n    user \"hi\"\n    expect no-tool \"{tool}\"\n}}\n",
            agent.url()
        )
    };
    write(&dir.path().join("suite.kdl"), &suite("refnd"));
    let mut watch = Watch::start(dir.path(), &[]);
    // Off a terminal, on stderr before the rerun they were loaded for (whose lines, on
    // stdout, this reads in no set order with them).
    let lines = watch
        .wait_for("watch: 1 warning in the suites")
        .await
        .join("\n");
    assert!(lines.contains("refnd"), "{lines}");

    write(&dir.path().join("suite.kdl"), &suite("refund"));
    let lines = watch
        .wait_for("watch: the suites' warnings are all gone")
        .await
        .join("\n");
    assert!(!lines.contains("refnd"), "{lines}");
}
