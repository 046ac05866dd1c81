//! The regression guard for the daily-loop figures (docs/performance.md): how many
//! allocations `trellis check suites/`, one trajectory against a built-in agent and each
//! turn of a run make, counted by the binary itself (`TRELLIS_COUNT_ALLOCATIONS=FILE`).
//!
//! Not a timing test: the count is nearly the same on every run and machine, and a budget
//! well above today's count (about 1.5×) only trips on a large regression, such as the KDL
//! parser allocating per character again (that made `check` about 209,000 allocations
//! instead of 24,300). Counts are of the binary under test (a debug build under `cargo
//! test`). When a change legitimately needs more, measure as in the docs and raise the
//! budget in the same commit, saying why.

use super::*;

/// `trellis check suites/` (measured: 20,897 allocations, the same on every run).
const CHECK_BUDGET: u64 = 31_000;

/// Each scenario `trellis check` reads, loads, validates and plans, over the ones before
/// it (measured: 107 for a one-turn scenario, the difference between suites of 1,000 and
/// 2,000 of them, the same on every run; 129 while every literal message built a template
/// scope to be checked against). A generated suite or a dataset has thousands of scenarios:
/// this is the part of `check` and of a run's start that grows with them.
const CHECK_SCENARIO_BUDGET: u64 = 125;

/// One trajectory against `builtin="booking"`, reports included (measured: 27,446; the
/// threads' interleaving moves it by a few).
const TRAJECTORY_BUDGET: u64 = 41_000;

/// A turn of one-turn trajectories, trajectory included: its records, verdict, journal
/// entry and table rows (measured: 98 in a debug build, the same on every run).
const ONE_TURN_BUDGET: u64 = 150;

/// A turn of a 40-turn conversation (measured: 57 at `--jobs 4`, the same on every run, 43
/// at the default `--jobs` on a quiet machine; runs of 4-turn conversations measured 54 or
/// 79, as the recorder's row groups fell).
const LONG_TURN_BUDGET: u64 = 75;

/// Runs `trellis` with the counter on and returns the count it wrote, after checking the
/// command succeeded.
async fn allocations(args: &[&std::ffi::OsStr], cwd: &Path) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("allocations");
    let o = trellis()
        .current_dir(cwd)
        .args(args)
        .env("TRELLIS_COUNT_ALLOCATIONS", &file)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "the binary wrote no allocation count to {} ({e}); stderr: {}",
            file.display(),
            stderr(&o)
        )
    });
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("allocation count {text:?}: {e}"))
}

fn within(what: &str, count: u64, budget: u64) {
    // A count far below the budget means the counter (not the code) broke: the guard
    // would then pass whatever happens.
    assert!(
        count >= budget / 20,
        "{what}: {count} allocations is implausibly few for a budget of {budget}: is the \
         counter counting?"
    );
    assert!(
        count <= budget,
        "{what}: {count} allocations, over the budget of {budget}. A large regression in the \
         work this command does; see docs/performance.md to find where (callgrind), or to \
         raise the budget if the new work is wanted"
    );
}

#[tokio::test]
async fn perf_check_of_the_example_suites_stays_within_its_allocation_budget() {
    let count = allocations(&["check".as_ref(), "suites/".as_ref()], &repo("")).await;
    within("trellis check suites/", count, CHECK_BUDGET);
}

#[tokio::test]
async fn perf_check_of_each_scenario_stays_within_its_allocation_budget() {
    let dir = tempfile::tempdir().unwrap();
    for n in [1_000, 2_000] {
        let mut suite = String::from(
            "agent \"agent\" protocol=\"connexity\" url=\"http://127.0.0.1:9/agent\"\n",
        );
        for i in 0..n {
            suite.push_str(&format!(
                "scenario \"s{i}\" {{\n    user \"hello\"\n    criteria {{\n        no-error\n    }}\n}}\n"
            ));
        }
        std::fs::write(dir.path().join(format!("s{n}.kdl")), suite).unwrap();
    }
    let count = |n: u32| {
        let file = format!("s{n}.kdl");
        let dir = dir.path().to_path_buf();
        async move { allocations(&["check".as_ref(), file.as_ref()], &dir).await }
    };
    let (fewer, more) = (count(1_000).await, count(2_000).await);
    within(
        "each scenario of `trellis check`",
        more.saturating_sub(fewer) / 1_000,
        CHECK_SCENARIO_BUDGET,
    );
}

#[tokio::test]
async fn perf_one_trajectory_stays_within_its_allocation_budget() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.kdl"),
        r#"agent "booking" protocol="connexity" builtin="booking"
scenario "one" {
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"#,
    )
    .unwrap();
    let count = allocations(
        &[
            "run".as_ref(),
            "one.kdl".as_ref(),
            "--out".as_ref(),
            "out".as_ref(),
            "-q".as_ref(),
        ],
        dir.path(),
    )
    .await;
    within("one trajectory", count, TRAJECTORY_BUDGET);
}

/// Allocations per turn, for one-turn trajectories and in a long conversation, against a
/// Connexity agent served by this test's process (`trellis_agents::fixed`), so that only the
/// engine's and the reporters' work is counted. The one-trajectory budget above cannot see
/// the turn path: a run's start and end are most of that count. A turn's work is the
/// difference between two runs of the same shape, over the turns one adds; both runs are
/// large enough that the first trajectories' extra work (the report's first transcripts)
/// is in both.
///
/// The long conversation guards against a turn's work growing with its history: the history
/// copied into each turn, for instance, makes a turn of a 40-turn conversation cost 124
/// allocations instead of 43 (tried with a `clone` of it in the Connexity session).
#[tokio::test]
async fn perf_each_turn_stays_within_its_allocation_budget_however_long_its_conversation() {
    let url = trellis_agents::fixed::serve(std::time::Duration::ZERO).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = async |name: &str, repeat: u32, turns: u32| {
        let mut suite = format!(
            "agent \"fixed\" protocol=\"connexity\" url=\"{url}\"\n\
             scenario \"{name}\" {{\n    repeat {repeat}\n"
        );
        for turn in 0..turns {
            suite.push_str(&format!(
                "    user \"Turn {turn}: a message of about the length people type to an \
                 agent.\"\n"
            ));
        }
        suite.push_str("    criteria {\n        no-error\n    }\n}\n");
        let file = format!("{name}.kdl");
        std::fs::write(dir.path().join(&file), suite).unwrap();
        let out = format!("out-{name}");
        // A bounded number of calls in flight: how many connections a run opens depends on
        // how its turns overlap, which a loaded machine changes (at the default `--jobs`, a
        // turn of one-turn trajectories counted 98 allocations on a quiet machine and 155 on
        // a busy one, from the connections alone); with a few, both runs open the same.
        let args: [&std::ffi::OsStr; 7] = [
            "run".as_ref(),
            file.as_ref(),
            "--out".as_ref(),
            out.as_ref(),
            "-q".as_ref(),
            "--jobs".as_ref(),
            "4".as_ref(),
        ];
        allocations(&args, dir.path()).await
    };
    let per_turn = async |name: &str, turns: u32, fewer: u32, more: u32| {
        let added = run(&format!("{name}-more"), more, turns).await;
        let base = run(&format!("{name}-fewer"), fewer, turns).await;
        added.saturating_sub(base) / u64::from((more - fewer) * turns)
    };
    let one_turn = per_turn("one-turn", 1, 200, 400).await;
    within("a turn of one-turn trajectories", one_turn, ONE_TURN_BUDGET);
    let long = per_turn("long", 40, 10, 20).await;
    within("a turn of 40-turn conversations", long, LONG_TURN_BUDGET);
}

/// `run.json`'s git state is read with both `git` commands running at once, beside the
/// loading of the suites, and without starting `git` at all outside a repository (each
/// start costs a one-trajectory run 5–15 ms): the state recorded must still be exact.
#[tokio::test]
async fn perf_run_records_the_git_state_with_git_started_only_in_a_repository() {
    let git = |dir: &Path, args: &[&str]| {
        let o = std::process::Command::new("git")
            .current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("this test needs `git` on the PATH: {e}"));
        assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let suite = r#"agent "booking" protocol="connexity" builtin="booking"
scenario "one" {
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"#;
    let run_json = async |dir: &Path, out: &str| {
        let o = trellis()
            .current_dir(dir)
            .args(["run", "one.kdl", "-q", "--out", out])
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let text = std::fs::read_to_string(dir.join(out).join("run.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };

    let repo_dir = tempfile::tempdir().unwrap();
    let dir = repo_dir.path();
    std::fs::write(dir.join("one.kdl"), suite).unwrap();
    std::fs::write(dir.join(".gitignore"), "runs*/\n").unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "suite"]);
    let head = git(dir, &["rev-parse", "HEAD"]);

    let clean = run_json(dir, "runs-clean").await;
    assert_eq!(clean["git"]["commit"], head.as_str(), "{clean}");
    assert_eq!(clean["git"]["dirty"], false, "{clean}");

    std::fs::write(dir.join("one.kdl"), format!("{suite}// changed\n")).unwrap();
    let dirty = run_json(dir, "runs-dirty").await;
    assert_eq!(dirty["git"]["commit"], head.as_str(), "{dirty}");
    assert_eq!(dirty["git"]["dirty"], true, "{dirty}");

    // Asked beside the user's own git work, `git status` takes no lock and writes no index:
    // a file whose times changed but not its text leaves `.git/index` as it was.
    git(dir, &["checkout", "-q", "one.kdl"]);
    git(dir, &["status", "--porcelain"]);
    let index = std::fs::read(dir.join(".git/index")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(dir.join("one.kdl"), suite).unwrap();
    let touched = run_json(dir, "runs-touched").await;
    assert_eq!(touched["git"]["dirty"], false, "{touched}");
    assert!(
        std::fs::read(dir.join(".git/index")).unwrap() == index,
        "trellis's `git status` rewrote the index"
    );
    std::fs::write(dir.join("one.kdl"), format!("{suite}// changed\n")).unwrap();

    let plain = tempfile::tempdir().unwrap();
    std::fs::write(plain.path().join("one.kdl"), suite).unwrap();
    let outside = run_json(plain.path(), "runs").await;
    assert!(outside.get("git").is_none_or(|g| g.is_null()), "{outside}");

    // `git` is asked about the suites given, before they load: a directory of the
    // repository named from outside it is the repository's.
    let o = trellis()
        .current_dir(plain.path())
        .arg("run")
        .arg(dir)
        .args(["-q", "--out", "runs-dir"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(plain.path().join("runs-dir").join("run.json")).unwrap();
    let by_dir: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(by_dir["git"]["commit"], head.as_str(), "{by_dir}");
    assert_eq!(by_dir["git"]["dirty"], true, "{by_dir}");
}

/// A line of the process `pid`'s `/proc` file `file` that starts with `label`, the label
/// taken off.
#[cfg(target_os = "linux")]
fn proc_field(pid: u32, file: &str, label: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in /proc/{pid}/{file}: {text}"))
        .trim()
        .to_owned()
}

/// What the kernel says of a `trellis run` in flight.
#[cfg(target_os = "linux")]
struct Descriptors {
    /// The size of its descriptor table (`FDSize`).
    table: usize,
    /// Its soft limit on open descriptors.
    soft_limit: usize,
}

/// The current limits on open descriptors of this process: (soft, hard).
#[cfg(target_os = "linux")]
fn descriptor_limits() -> (libc::rlim_t, libc::rlim_t) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes into `limit`, which lives through the call.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    (limit.rlim_cur, limit.rlim_max)
}

/// The descriptors of a `trellis run --jobs 300` of one trajectory, read while it waits
/// for its agent's answer; `limits` (soft, hard) are set in the child before it starts.
#[cfg(target_os = "linux")]
async fn run_descriptors(limits: Option<(libc::rlim_t, libc::rlim_t)>) -> Descriptors {
    use crate::support::{Behavior, MisbehavingServer, OK_BODY};
    use std::process::Stdio;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    let agent = MisbehavingServer::start(Behavior::Delayed {
        delay: Duration::from_secs(60),
        body: OK_BODY.to_owned(),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.kdl"),
        format!(
            "agent \"slow\" protocol=\"connexity\" url=\"{}\"\nscenario \"one\" {{\n    user \"hello\"\n}}\n",
            agent.url()
        ),
    )
    .unwrap();
    let mut cmd = trellis();
    cmd.current_dir(dir.path())
        .args(["run", "one.kdl", "-q", "--out", "out", "--jobs", "300"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((soft, hard)) = limits {
        // SAFETY: only `setrlimit`, async-signal-safe, runs in the child before it execs.
        unsafe {
            cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    // Its one request reached the agent: the run's threads are all up, its files open.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while agent.stats.requests.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never called its agent"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it called its agent");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let table = proc_field(pid, "status", "FDSize:").parse().unwrap();
    let limits = proc_field(pid, "limits", "Max open files");
    let soft_limit = limits
        .split_whitespace()
        .next()
        .and_then(|soft| soft.parse().ok())
        .unwrap_or_else(|| panic!("Max open files: {limits}"));
    child.kill().await.unwrap();
    Descriptors { table, soft_limit }
}

/// `trellis run` makes room for its connections before it starts a thread
/// (src/descriptors.rs): grown later, each doubling of the descriptor table stalls the
/// thread that opens the descriptor (the run's, as its first units connect) for an RCU
/// grace period. One trajectory opens a handful of descriptors, so a table with room for
/// 2 × 300 connections and the run's files (728) was made up front. A soft limit lower
/// than that is raised, as far as the hard limit allows.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn perf_a_run_makes_room_for_its_connections_before_its_first_thread() {
    let wanted: usize = 2 * 300 + 128;
    let (_, hard) = descriptor_limits();
    let room = usize::try_from(hard).unwrap_or(usize::MAX).min(wanted);
    let run = run_descriptors(None).await;
    assert!(
        run.table >= room,
        "descriptor table of {} slots, wanted {room}",
        run.table
    );

    let hard = hard.min(400);
    let run = run_descriptors(Some((200, hard))).await;
    let hard = usize::try_from(hard).unwrap();
    assert_eq!(
        run.soft_limit, hard,
        "the soft limit of 200 raised to the hard one"
    );
    assert!(
        (hard..=512).contains(&run.table),
        "descriptor table of {} slots under a hard limit of {hard}",
        run.table
    );
}
