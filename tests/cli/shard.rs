//! Sharded runs and `trellis merge`: the recipes of docs/sharding.md run as their runners
//! would run them (one process per index, the runner's variables, a pod killed and started
//! again), merged, and held to an unsharded run of the same suites: trajectories, statuses,
//! check results and agent calls; then what a merge refuses, what a shard is told by its
//! environment, and rate budgets divided among shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_yaml_ng::Value as Yaml;
use trellis_testkit::{Behavior, MisbehavingServer, OK_BODY};

use super::*;

/// What an unsharded run and a merged one must agree on.
#[derive(Debug, PartialEq)]
struct Results {
    /// `suite/scenario trajectory [agent #repetition] status`, sorted.
    trajectories: Vec<String>,
    /// `suite/scenario trajectory [agent #repetition] turn criterion status`, sorted.
    criteria: Vec<String>,
    /// Turns that called the agent (replays left out), per suite/scenario.
    agent_calls: BTreeMap<String, usize>,
    /// Every turn recorded, replays included.
    turns: usize,
    /// `runs.parquet`: trajectories, passed, failed, errors, skipped, turns, planned.
    totals: Vec<u64>,
}

/// The last line `merge --allow-partial --message-format json` prints (its end) for `shards`
/// merged into `out`.
async fn partial_merge_end(shards: &[&PathBuf], out: &Path) -> serde_json::Value {
    let json = trellis()
        .arg("merge")
        .args(shards)
        .args(["--allow-partial", "--message-format", "json", "--out"])
        .arg(out)
        .output()
        .await
        .unwrap();
    serde_json::from_str(stdout(&json).lines().last().unwrap_or("null")).unwrap()
}

fn results(dir: &Path) -> Results {
    let t = read_parquet(&dir.join("trajectories.parquet"));
    let key = |df: &DataFrame, i: usize| {
        let s = |c: &str| {
            df.column(c)
                .unwrap()
                .str()
                .unwrap()
                .get(i)
                .unwrap()
                .to_owned()
        };
        let rep = df
            .column("repetition")
            .unwrap()
            .u32()
            .unwrap()
            .get(i)
            .unwrap();
        format!(
            "{}/{} {} [{} #{rep}]",
            s("suite"),
            s("scenario"),
            s("trajectory"),
            s("agent")
        )
    };
    let status = strings(&t, "status");
    let mut trajectories: Vec<String> = (0..t.height())
        .map(|i| format!("{} {}", key(&t, i), status[i].clone().unwrap()))
        .collect();
    trajectories.sort();

    let c = read_parquet(&dir.join("criteria.parquet"));
    let criterion = strings(&c, "criterion");
    let status = strings(&c, "status");
    let turn = c.column("turn_index").unwrap().u32().unwrap();
    let mut criteria: Vec<String> = (0..c.height())
        .map(|i| {
            format!(
                "{} turn {:?} {} {}",
                key(&c, i),
                turn.get(i),
                criterion[i].clone().unwrap(),
                status[i].clone().unwrap()
            )
        })
        .collect();
    criteria.sort();

    let turns = read_parquet(&dir.join("turns.parquet"));
    let suites = strings(&turns, "suite");
    let scenarios = strings(&turns, "scenario");
    let replay = turns.column("replay").unwrap().bool().unwrap();
    let mut agent_calls: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..turns.height() {
        if replay.get(i) != Some(true) {
            let key = format!(
                "{}/{}",
                suites[i].clone().unwrap(),
                scenarios[i].clone().unwrap()
            );
            *agent_calls.entry(key).or_default() += 1;
        }
    }

    let runs = read_parquet(&dir.join("runs.parquet"));
    let totals = [
        "trajectories",
        "passed",
        "failed",
        "errors",
        "skipped",
        "turns",
        "planned_trajectories",
    ]
    .iter()
    .map(|c| runs.column(c).unwrap().u64().unwrap().get(0).unwrap())
    .collect();
    Results {
        trajectories,
        criteria,
        agent_calls,
        turns: turns.height(),
        totals,
    }
}

/// A `sh`/`bash` command line as a runner runs it: in `cwd`, with `trellis` on the PATH and
/// no shard variables but `vars`, in a process group of its own (so a kill takes trellis
/// with it, as a pod's end does).
fn runner_command(
    shell: &[&str],
    line: &str,
    cwd: &Path,
    vars: &[(&str, String)],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(shell[0]);
    cmd.args(&shell[1..]).arg(line).current_dir(cwd);
    without_runner_shards(&mut cmd);
    let bin = Path::new(env!("CARGO_BIN_EXE_trellis")).parent().unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![bin.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    cmd.env("PATH", std::env::join_paths(paths).unwrap());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.process_group(0);
    cmd.kill_on_drop(true);
    cmd
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The fenced `yaml` block of docs/sharding.md whose text contains `marker`.
fn recipe(marker: &str) -> String {
    let doc = std::fs::read_to_string(repo("docs/sharding.md")).unwrap();
    doc.split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .find(|block| block.contains(marker))
        .unwrap_or_else(|| panic!("docs/sharding.md has no yaml block with {marker}"))
        .to_owned()
}

fn said(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o))
}

#[tokio::test]
async fn the_github_actions_recipe_merges_the_example_suites_into_the_unsharded_run() {
    let workflow: Yaml = serde_yaml_ng::from_str(&recipe("matrix:")).unwrap();
    let shard_job = &workflow["jobs"]["shard"];
    let indices: Vec<u64> = shard_job["strategy"]["matrix"]["shard"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(indices, [1, 2, 3]);
    let step = |job: &Yaml, name: &str| -> String {
        job["steps"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|s| s["name"].as_str() == Some(name))
            .and_then(|s| s["run"].as_str())
            .unwrap_or_else(|| panic!("no step `{name}` with a `run`"))
            .to_owned()
    };
    let run_shard = step(shard_job, "Run shard");
    let merge = step(&workflow["jobs"]["merge"], "Merge");
    // GitHub's default shell for `run` steps.
    let bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"];

    let tmp = tempfile::tempdir().unwrap();
    // The unsharded run, in a checkout of its own.
    let whole_ws = tmp.path().join("whole");
    copy_dir(&repo("suites"), &whole_ws.join("suites"));
    let whole = trellis()
        .args(["run", "suites/", "--out", "whole", "--quiet"])
        .current_dir(&whole_ws)
        .output()
        .await
        .unwrap();
    assert_eq!(whole.status.code(), Some(1), "{}", said(&whole));

    // Each matrix job: a fresh checkout, the shard's step, its directory uploaded.
    let merge_ws = tmp.path().join("merge");
    copy_dir(&repo("suites"), &merge_ws.join("suites"));
    let mut jobs = Vec::new();
    for i in &indices {
        let ws = tmp.path().join(format!("job-{i}"));
        copy_dir(&repo("suites"), &ws.join("suites"));
        let line = run_shard.replace("${{ matrix.shard }}", &i.to_string());
        jobs.push((ws.clone(), runner_command(&bash, &line, &ws, &[]).output()));
    }
    for (ws, job) in jobs {
        let o = job.await.unwrap();
        // Failed checks are the merge's to report: the step passes.
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
        assert!(stderr(&o).contains("from --shard"), "{}", said(&o));
        // upload-artifact `shard-N` + download-artifact `pattern: shard-*`, `path: shards`.
        let shards = ws.join("shards");
        for entry in std::fs::read_dir(&shards).unwrap() {
            let entry = entry.unwrap();
            copy_dir(
                &entry.path(),
                &merge_ws.join("shards").join(entry.file_name()),
            );
        }
    }
    let step_summary = tmp.path().join("step-summary.md");
    // On GitHub every job's checkout is at one path, $GITHUB_WORKSPACE; here each job has
    // its own, and the merge places annotations by the first job's, whose suites the shards
    // recorded.
    let first_checkout = tmp.path().join(format!("job-{}", indices[0]));
    let in_workflow = [
        ("GITHUB_ACTIONS", "true".to_owned()),
        ("GITHUB_STEP_SUMMARY", step_summary.display().to_string()),
        ("GITHUB_WORKSPACE", first_checkout.display().to_string()),
    ];
    let merged = runner_command(&bash, &merge, &merge_ws, &in_workflow)
        .output()
        .await
        .unwrap();
    // The example suites fail on purpose: the merge step is the verdict.
    assert_eq!(merged.status.code(), Some(1), "{}", said(&merged));
    // The pull request hears of the merged run's failures as of a run's: annotations on the
    // failed check's line of the suites the shards recorded (here the first job's checkout;
    // on GitHub every job's is at the same path), the job summary, and each failed check's
    // place on the console.
    let out = stdout(&merged);
    assert!(
        out.lines().any(|l| l.starts_with("::error file=")
            && l.contains(
                "suites/booking.kdl,line=46,col=9,title=booking/book-duct-cleaning [demo] failed::"
            )),
        "{}",
        said(&merged)
    );
    let written = std::fs::read_to_string(&step_summary).unwrap();
    assert!(written.starts_with("### Trellis run `"), "{written}");
    assert!(
        said(&merged).contains("suites/booking.kdl:"),
        "{}",
        said(&merged)
    );
    assert!(
        stdout(&merged).contains("merged 3 shards of 3"),
        "{}",
        said(&merged)
    );
    let merged_dir = merge_ws.join("runs/merged");
    let sharded = results(&merged_dir);
    let unsharded = results(&whole_ws.join("whole"));
    assert_eq!(sharded, unsharded);
    // What each directory holds, for whoever reads the tables alone.
    let kind = |dir: &Path| {
        strings(&read_parquet(&dir.join("runs.parquet")), "kind")[0]
            .clone()
            .unwrap()
    };
    assert_eq!(kind(&merged_dir), "merged");
    assert_eq!(kind(&whole_ws.join("whole")), "run");
    let a_shard = std::fs::read_dir(merge_ws.join("shards"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(kind(&a_shard), "shard");
    assert!(unsharded.trajectories.len() > 50, "{unsharded:?}");
    for file in ["report.html", "junit.xml", "summary.json"] {
        assert!(merged_dir.join(file).is_file(), "{file}");
    }
    let junit = |dir: &Path| {
        std::fs::read_to_string(dir.join("junit.xml"))
            .unwrap()
            .matches("<testcase")
            .count()
    };
    assert_eq!(junit(&merged_dir), junit(&whole_ws.join("whole")));
    // LLM use per role (the model builtins' calls) is the shards' together.
    let roles = |dir: &Path| -> serde_json::Value {
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        summary["stats"]["aggregates"]["llm_roles"]["agent"]["calls"].clone()
    };
    assert!(roles(&whole_ws.join("whole")).as_u64().unwrap() > 0);
    assert_eq!(roles(&merged_dir), roles(&whole_ws.join("whole")));

    // The merged run is a whole run of the history; the shards are not.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(merged_dir.join("run.json")).unwrap())
            .unwrap();
    assert_eq!(meta["merged"]["shards"], 3);
    assert!(meta.get("shard").is_none(), "{meta}");
    let runs = trellis()
        .args(["runs", "--json", "--dir"])
        .arg(merge_ws.join("shards"))
        .output()
        .await
        .unwrap();
    assert_eq!(stdout(&runs).trim(), "[]", "{}", said(&runs));
    let compare = trellis()
        .arg("compare")
        .arg(whole_ws.join("whole"))
        .arg(&merged_dir)
        // Three processes on two cores are not one: only latency may differ.
        .args([
            "--max-latency-increase",
            "100000",
            "--latency-noise-ms",
            "100000",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(compare.status.code(), Some(0), "{}", said(&compare));
    let shard_compare = trellis()
        .arg("compare")
        .arg(whole_ws.join("whole"))
        .arg(merge_ws.join("shards/shard-2"))
        .output()
        .await
        .unwrap();
    assert_eq!(
        shard_compare.status.code(),
        Some(2),
        "{}",
        said(&shard_compare)
    );
    assert!(
        stderr(&shard_compare).contains("holds one shard of a run"),
        "{}",
        said(&shard_compare)
    );
    let rejudge = trellis()
        .arg("rejudge")
        .arg(merge_ws.join("shards/shard-2"))
        .arg(merge_ws.join("suites"))
        .arg("--out")
        .arg(tmp.path().join("rejudged"))
        .output()
        .await
        .unwrap();
    assert_eq!(rejudge.status.code(), Some(2), "{}", said(&rejudge));
    assert!(
        flat(&stderr(&rejudge)).contains("holds one shard of a run; merge the shards first"),
        "{}",
        said(&rejudge)
    );
    assert!(!tmp.path().join("rejudged").exists());
}

/// 500 scenarios, each a shared prefix and two branches, repeated 3 times: 3,000 trajectory
/// runs and 4,500 agent calls (3 a repetition: the prefix once, each branch once), against
/// `url`, each request tagged with the process's `COUNT_TAG`. Every fourth scenario fails
/// its `a` branch; every twentieth needs the one before it (which passes).
fn counted_suite(url: &str) -> String {
    let mut text = format!(
        "suite \"load\"\nagent \"counted\" protocol=\"connexity\" url=\"{url}\" {{\n    \
         header \"X-Count\" \"{{{{ env.COUNT_TAG }}}}\"\n}}\n"
    );
    for i in 0..500 {
        let expected = if i % 4 == 3 { "Goodbye" } else { "Hello" };
        let needs = if i % 20 == 1 {
            format!("    needs \"s{:03}\"\n", i - 1)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "scenario \"s{i:03}\" {{\n    repeat 3\n{needs}    user \"Hi {i}\"\n    \
             expect reply contains=\"Hello\"\n    branch \"a\" {{\n        user \"A\"\n        \
             expect reply contains=\"{expected}\"\n    }}\n    branch \"b\" {{\n        \
             user \"B\"\n        expect no-error\n    }}\n}}\n"
        ));
    }
    text
}

#[tokio::test]
async fn the_kubernetes_recipe_shards_3000_trajectories_with_a_pod_killed_and_resumed() {
    let manifest = recipe("completionMode: Indexed");
    let docs: Vec<Yaml> = serde_yaml_ng::Deserializer::from_str(&manifest)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "the shards' Job and the merge Job");
    let container = |doc: &Yaml| doc["spec"]["template"]["spec"]["containers"][0].clone();
    let job = &docs[0];
    assert_eq!(job["spec"]["completionMode"].as_str(), Some("Indexed"));
    let completions = job["spec"]["completions"].as_u64().unwrap();
    assert_eq!(completions, 3);
    let shard_container = container(job);
    let shell = |c: &Yaml| -> Vec<String> {
        c["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let shard_shell = shell(&shard_container);
    assert_eq!(shard_shell, ["sh", "-c"]);
    let work_dir = shard_container["workingDir"].as_str().unwrap();
    assert_eq!(work_dir, "/work");
    let env_of = |c: &Yaml| -> Vec<(String, String)> {
        c["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let env = env_of(&shard_container);
    let run_results = "/results/run-PIPELINE_ID".to_owned();
    assert_eq!(
        env,
        [
            ("TRELLIS_SHARDS".to_owned(), "3".to_owned()),
            ("RESULTS".to_owned(), run_results.clone())
        ]
    );
    let merge_container = container(&docs[1]);
    assert_eq!(shell(&merge_container), ["sh", "-c"]);
    // Both Jobs of a run write and read one directory of that run.
    assert_eq!(
        env_of(&merge_container),
        [("RESULTS".to_owned(), run_results.clone())]
    );

    // `/results` is the volume every pod mounts; `/work` the image's working directory.
    let tmp = tempfile::tempdir().unwrap();
    let volume = tmp.path().join("results");
    let local = |line: &str| line.replace("/results", volume.to_str().unwrap());
    let results_dir = PathBuf::from(local(&run_results));
    std::fs::create_dir_all(&results_dir).unwrap();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), local(v))).collect();
    let merge_env = [("RESULTS", local(&run_results))];
    let shard_line = shard_container["args"][0].as_str().unwrap().to_owned();
    let merge_line = merge_container["args"][0].as_str().unwrap().to_owned();

    // The agent: answers every call, counted by the tag of the process that made it, and
    // stalls the first attempt of pod 1 after 300 calls, to be killed there.
    let server = MisbehavingServer::start(Behavior::HangAfter {
        body: OK_BODY.to_owned(),
        header: "X-Count".to_owned(),
        value: "pod-1-killed".to_owned(),
        after: 300,
    })
    .await;
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("suites")).unwrap();
    std::fs::write(work.join("suites/load.kdl"), counted_suite(&server.url())).unwrap();

    let whole = trellis()
        .args(["run", "suites/", "--quiet", "--out"])
        .arg(tmp.path().join("whole"))
        .env("COUNT_TAG", "whole")
        .current_dir(&work)
        .output()
        .await
        .unwrap();
    assert_eq!(whole.status.code(), Some(1), "{}", said(&whole));
    assert_eq!(server.requests_with("X-Count", "whole"), 4500);

    let pod = |index: u64, tag: &str| {
        let mut vars: Vec<(&str, String)> =
            env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        vars.push(("JOB_COMPLETION_INDEX", index.to_string()));
        vars.push(("COUNT_TAG", tag.to_owned()));
        let shell: Vec<&str> = shard_shell.iter().map(String::as_str).collect();
        runner_command(&shell, &shard_line, &work, &vars)
    };
    let mut killed = pod(1, "pod-1-killed").spawn().unwrap();
    let others: Vec<_> = [0, 2]
        .into_iter()
        .map(|i| (i, pod(i, &format!("pod-{i}")).output()))
        .collect();
    // Pod 1 stalls once its 300 calls are answered: the node is lost there.
    let stalled = async {
        while server.tagged() <= 300 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(120), stalled)
        .await
        .expect("pod 1 never reached its 300th call");
    let pgid = killed.id().unwrap() as i32;
    assert_eq!(unsafe { libc::kill(-pgid, libc::SIGKILL) }, 0);
    let status = killed.wait().await.unwrap();
    assert_eq!(status.code(), None, "killed by a signal");
    for (i, pod) in others {
        let o = pod.await.unwrap();
        assert_eq!(o.status.code(), Some(0), "pod {i}: {}", said(&o));
        assert!(
            stderr(&o).contains(&format!(
                "shard {}/3, from JOB_COMPLETION_INDEX={i} and TRELLIS_SHARDS=3 (a Kubernetes Indexed Job)",
                i + 1
            )),
            "pod {i}: {}",
            said(&o)
        );
    }

    // Merged now, the killed shard's unfinished trajectories are missing, by name.
    let merge_shell: Vec<String> = shell(&merge_container);
    let merge_shell: Vec<&str> = merge_shell.iter().map(String::as_str).collect();
    let early = runner_command(&merge_shell, &merge_line, &work, &merge_env)
        .output()
        .await
        .unwrap();
    assert_eq!(early.status.code(), Some(1), "{}", said(&early));
    let text = stderr(&early);
    assert!(
        text.contains("shard 2/3 (") && text.contains("its run did not finish"),
        "{}",
        said(&early)
    );
    let listed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("    load/s"))
        .collect();
    assert_eq!(listed.len(), 20, "the first 20 listed: {}", said(&early));
    assert!(
        listed.iter().all(|l| l.contains(" [counted #")),
        "{listed:?}"
    );
    assert!(text.contains("nothing was written"), "{}", said(&early));
    assert!(!results_dir.join("merged").exists());
    // The same with --verbose lists each missing trajectory run once, and the count says
    // how many there are.
    let verbose = trellis()
        .arg("merge")
        .args((0..3).map(|i| results_dir.join(format!("shard-{i}"))))
        .arg("--verbose")
        .arg("--out")
        .arg(tmp.path().join("unused"))
        .output()
        .await
        .unwrap();
    assert_eq!(verbose.status.code(), Some(1), "{}", said(&verbose));
    let verbose_text = stderr(&verbose);
    let all: Vec<&str> = verbose_text
        .lines()
        .filter(|l| l.starts_with("    load/s"))
        .map(str::trim)
        .collect::<Vec<_>>();
    let missing_line = verbose_text
        .lines()
        .find(|l| l.starts_with("error: the shards do not cover the plan"))
        .unwrap()
        .to_owned();
    assert!(
        missing_line.contains(&format!("{} of 3000 trajectory runs", all.len())),
        "{missing_line}"
    );
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len());

    // What the killed shard kept: its journal, read as a report of the unfinished run.
    let killed_dir = results_dir.join("shard-1");
    let killed_report = tmp.path().join("killed-report");
    let report = trellis()
        .arg("report")
        .arg(&killed_dir)
        .arg("--out")
        .arg(&killed_report)
        .output()
        .await
        .unwrap();
    assert!(report.status.success(), "{}", said(&report));
    let kept = results(&killed_report).trajectories;
    assert!(!kept.is_empty() && kept.len() < 1000, "{} kept", kept.len());
    // Each repetition is a prefix call and one call per branch: a repetition with both
    // trajectories finished needs no call again, one with a single finished trajectory
    // sends the prefix and the other branch (2), one with none all three.
    let mut finished_per_rep: std::collections::HashMap<String, usize> = Default::default();
    for t in &kept {
        // "load/s001 a [counted #1] passed": the scenario and the repetition.
        let mut words = t.split(' ');
        let scenario = words.next().unwrap();
        let rep = t.split('#').nth(1).unwrap().split(']').next().unwrap();
        *finished_per_rep
            .entry(format!("{scenario} #{rep}"))
            .or_default() += 1;
    }
    let saved: usize = finished_per_rep
        .values()
        .map(|f| match f {
            2 => 3,
            1 => 1,
            n => panic!("{n} trajectories finished in one repetition of two"),
        })
        .sum();
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(killed_dir.join("shard.json")).unwrap())
            .unwrap();
    let shard_reps = split["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["shard"] == 2)
        .map(|s| s["info"]["repeat"].as_u64().unwrap() as usize)
        .sum::<usize>();
    let run_json = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap()
    };
    let killed_meta = run_json(&killed_dir);

    // The Job starts pod 1 again with the same index, the same command: it finds its
    // shard's journal and resumes it.
    let again = pod(1, "pod-1").output().await.unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", said(&again));
    // (`--quiet` leaves out the line saying it resumed; the calls below show it.)
    assert!(
        stderr(&again).contains("shard 2/3, from "),
        "{}",
        said(&again)
    );
    // No finished trajectory was sent again: the restarted pod made exactly the calls of
    // what had not finished.
    assert_eq!(
        server.requests_with("X-Count", "pod-1"),
        3 * shard_reps - saved,
        "{}",
        said(&again)
    );
    // Its run.json is the one it started with, shard and all.
    let resumed_meta = run_json(&killed_dir);
    assert_eq!(resumed_meta["shard"], killed_meta["shard"]);
    assert_eq!(resumed_meta["shard"]["index"], 2);
    assert_eq!(resumed_meta["run_id"], killed_meta["run_id"]);

    let merged = runner_command(&merge_shell, &merge_line, &work, &merge_env)
        .output()
        .await
        .unwrap();
    // Every fourth scenario fails on purpose: the merge's exit code is the verdict.
    assert_eq!(merged.status.code(), Some(1), "{}", said(&merged));
    assert!(
        stdout(&merged).contains("merged 3 shards of 3"),
        "{}",
        said(&merged)
    );
    let mut sharded = results(&results_dir.join("merged"));
    let unsharded = results(&tmp.path().join("whole"));
    assert_eq!(sharded.trajectories.len(), 3000);
    // A repetition killed between its two branches sent its one-turn prefix again for the
    // branch that had not finished: that turn is recorded (as a replay), the rest is equal.
    let replays = finished_per_rep.values().filter(|&&f| f == 1).count();
    assert_eq!(sharded.turns, unsharded.turns + replays);
    assert_eq!(sharded.totals[5], unsharded.totals[5] + replays as u64);
    sharded.turns = unsharded.turns;
    sharded.totals[5] = unsharded.totals[5];
    assert_eq!(sharded, unsharded);
    // The agent was called as often by the three pods as by one run (the killed pod's
    // finished trajectories counted once): no prefix was split, nothing finished sent twice.
    let calls: usize = ["pod-0", "pod-1", "pod-2"]
        .iter()
        .map(|tag| server.requests_with("X-Count", tag))
        .sum();
    assert_eq!(calls + saved, 4500);
    assert_eq!(
        server.requests_with("X-Count", "pod-0")
            + server.requests_with("X-Count", "pod-2")
            + 3 * shard_reps,
        4500
    );
    for tag in ["pod-0", "pod-1", "pod-2"] {
        assert!(
            server.requests_with("X-Count", tag) > 0,
            "{tag} ran nothing"
        );
    }
}

/// Three tiny scenarios against the builtin booking agent, one needing another.
const SMALL: &str = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "one" {
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
scenario "two" {
    needs "one"
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
scenario "three" {
    repeat 2
    user "How much does a duct cleaning cost?"
    expect reply contains="$249"
}
"#;

fn small_suite(dir: &Path) -> PathBuf {
    let suite = dir.join("small.kdl");
    std::fs::write(&suite, SMALL).unwrap();
    suite
}

async fn run_shard(suite: &Path, shard: &str, out: &Path, extra: &[&str]) -> Output {
    trellis()
        .arg("run")
        .arg(suite)
        .args(["--shard", shard, "--quiet", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .await
        .unwrap()
}

/// Balanced by trajectory count whatever runs are next to the shard.
const NONE: &[&str] = &["--shard-costs", "none"];

fn shard_plan(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("shard.json")).unwrap()).unwrap()
}

#[tokio::test]
async fn shards_split_by_scenario_with_needs_together_and_empty_shards_still_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    // Four shards for two units (one+two, three): two shards have nothing to run.
    let mut dirs = Vec::new();
    for i in 1..=4 {
        let out = tmp.path().join(format!("shards/{i}"));
        let o = run_shard(&suite, &format!("{i}/4"), &out, &["--shard-costs", "none"]).await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
        dirs.push(out);
    }
    let plan = shard_plan(&dirs[0]);
    let shard_of = |name: &str| {
        plan["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["info"]["scenario"] == name)
            .unwrap()["shard"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        shard_of("one"),
        shard_of("two"),
        "needs keep scenarios together"
    );
    assert_ne!(shard_of("one"), shard_of("three"));
    assert_eq!(plan["balance"]["by"], "trajectories");
    // Every shard wrote the same split.
    for dir in &dirs[1..] {
        assert_eq!(shard_plan(dir)["digest"], plan["digest"]);
        assert_eq!(shard_plan(dir)["scenarios"], plan["scenarios"]);
    }
    let empty = (1..=4u64)
        .find(|i| ![shard_of("one"), shard_of("three")].contains(i))
        .unwrap();
    let o = run_shard(
        &suite,
        &format!("{empty}/4"),
        &tmp.path().join("again"),
        &["--shard-costs", "none"],
    )
    .await;
    assert!(
        stderr(&o).contains(&format!("shard {empty}/4 has nothing to run")),
        "{}",
        said(&o)
    );

    // `-q`, as a CI script writes it after `run -q`.
    let merged = trellis()
        .arg("merge")
        .args(&dirs)
        .args(["-q", "--out"])
        .arg(tmp.path().join("merged"))
        .output()
        .await
        .unwrap();
    assert_eq!(merged.status.code(), Some(0), "{}", said(&merged));
    let whole = trellis()
        .arg("run")
        .arg(&suite)
        .args(["--quiet", "--out"])
        .arg(tmp.path().join("whole"))
        .output()
        .await
        .unwrap();
    assert_eq!(whole.status.code(), Some(0), "{}", said(&whole));
    assert_eq!(
        results(&tmp.path().join("merged")),
        results(&tmp.path().join("whole"))
    );
    // The shards ran one after the other, and the merged run's clock says so: a turn's
    // `started_ms` counts from the merged run's start, not from its shard's.
    let turns = read_parquet(&tmp.path().join("merged/turns.parquet"));
    let scenarios = strings(&turns, "scenario");
    let column = |name: &str| -> Vec<f64> {
        turns
            .column(name)
            .unwrap()
            .f64()
            .unwrap()
            .iter()
            .map(Option::unwrap)
            .collect()
    };
    let (started, latency) = (column("started_ms"), column("latency_ms"));
    let span = |scenario: &str| {
        let rows = || (0..started.len()).filter(|&i| scenarios[i].as_deref() == Some(scenario));
        let first = rows().map(|i| started[i]).fold(f64::INFINITY, f64::min);
        let last = rows().map(|i| started[i] + latency[i]).fold(0.0, f64::max);
        (first, last)
    };
    let (earlier, later) = if shard_of("one") < shard_of("three") {
        (span("one"), span("three"))
    } else {
        (span("three"), span("one"))
    };
    assert!(
        later.0 > earlier.1,
        "the later shard's turns start after the earlier shard's end: {earlier:?} {later:?}"
    );

    // Merging twice into one directory is refused unless --replace, as for runs.
    let twice = trellis()
        .arg("merge")
        .args(&dirs)
        .arg("--out")
        .arg(tmp.path().join("merged"))
        .output()
        .await
        .unwrap();
    assert_eq!(twice.status.code(), Some(2), "{}", said(&twice));
    assert!(stderr(&twice).contains("--replace"), "{}", said(&twice));

    // A missing shard is named with its scenarios; --allow-partial merges the rest as an
    // unfinished run.
    let without: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| !d.ends_with(shard_of("three").to_string()))
        .collect();
    let partial = trellis()
        .arg("merge")
        .args(&without)
        .arg("--allow-partial")
        .arg("--out")
        .arg(tmp.path().join("partial"))
        .output()
        .await
        .unwrap();
    assert_eq!(partial.status.code(), Some(1), "{}", said(&partial));
    assert!(
        stderr(&partial).contains(&format!(
            "shard {}/4: no directory given; it holds 1 scenario (2 trajectory runs): small/three",
            shard_of("three")
        )),
        "{}",
        said(&partial)
    );
    assert!(
        stdout(&partial).contains("run did not finish"),
        "{}",
        said(&partial)
    );
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("partial/run.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["merged"]["partial"], true);
    assert_eq!(meta["merged"]["missing"], 2);
    // Its JSON end: not finished, and counting what it merged (every count was null).
    let last = partial_merge_end(&without, &tmp.path().join("partial-json")).await;
    assert_eq!(last["type"], "run_finished", "{last}");
    assert_eq!(last["finished"], false, "{last}");
    let merged = results(&tmp.path().join("partial-json")).trajectories.len();
    assert_eq!(last["trajectories"], merged, "{last}");
    let counted: u64 = ["passed", "failed", "errors", "skipped", "invalid"]
        .iter()
        .map(|k| last[k].as_u64().unwrap_or_else(|| panic!("{k}: {last}")))
        .sum();
    assert_eq!(counted, merged as u64, "{last}");
    // How long the merged shards took, and whether one was cut short: known, not null.
    assert!(
        last["duration_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{last}"
    );
    assert_eq!(last["interrupted"], false, "{last}");

    // A shard killed before it recorded its end (its journal without `run_finished`),
    // merged with the others: the merge was cut short, and its JSON end says so.
    let killed = tmp.path().join("killed-shard");
    std::fs::create_dir(&killed).unwrap();
    for entry in std::fs::read_dir(&dirs[0]).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), killed.join(entry.file_name())).unwrap();
        }
    }
    let mut kept: Vec<String> = journal_text(&killed)
        .lines()
        .filter(|l| !l.contains("\"run_finished\""))
        .map(str::to_owned)
        .collect();
    // Killed before its last trajectory was recorded.
    let last = kept
        .iter()
        .rposition(|l| l.starts_with("{\"trajectory\""))
        .expect("a trajectory");
    kept.remove(last);
    let mut writer =
        trellis_engine::journal::JournalWriter::create_at(&killed.join(JOURNAL)).unwrap();
    for line in kept {
        writer.append_line(line.as_bytes()).unwrap();
    }
    drop(writer);
    let with_killed: Vec<&PathBuf> = std::iter::once(&killed).chain(&dirs[1..]).collect();
    let last = partial_merge_end(&with_killed, &tmp.path().join("killed-json")).await;
    assert_eq!(last["type"], "run_finished", "{last}");
    assert_eq!(last["interrupted"], true, "{last}");

    // Finished with --resume, it misses nothing any more, and says so.
    let resumed = trellis()
        .arg("run")
        .arg(&suite)
        .arg("--resume")
        .arg(tmp.path().join("partial"))
        .output()
        .await
        .unwrap();
    assert!(
        matches!(resumed.status.code(), Some(0 | 1)),
        "{}",
        said(&resumed)
    );
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("partial/run.json")).unwrap(),
    )
    .unwrap();
    assert!(meta["merged"]["partial"].is_null(), "{meta}");
    assert!(meta["merged"]["missing"].is_null(), "{meta}");
    assert_eq!(meta["merged"]["shards"], 4, "{meta}");
}

#[tokio::test]
async fn merge_refuses_directories_that_are_not_shards_of_one_split() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    for (i, dir) in [(1, &a), (2, &b)] {
        let o = run_shard(&suite, &format!("{i}/2"), dir, NONE).await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    }
    let merge = |dirs: Vec<PathBuf>| {
        let out = tmp.path().join("out");
        async move {
            trellis()
                .arg("merge")
                .args(dirs)
                .arg("--out")
                .arg(out)
                .output()
                .await
                .unwrap()
        }
    };
    let refused = |o: &Output, needle: &str| {
        assert_eq!(o.status.code(), Some(2), "{}", said(o));
        assert!(flat(&stderr(o)).contains(needle), "{needle}: {}", said(o));
        assert!(!tmp.path().join("out").exists());
    };

    // A whole run is not a shard.
    let whole = tmp.path().join("whole");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .args(["--quiet", "--out"])
        .arg(&whole)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), whole]).await,
        "a whole run, not a shard of one",
    );
    refused(
        &merge(vec![tmp.path().join("nowhere")]).await,
        "no such directory",
    );

    // One shard twice, in two directories.
    let a_again = tmp.path().join("a-again");
    let o = run_shard(&suite, "1/2", &a_again, NONE).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), a_again, b.clone()]).await,
        "shard 1 is given twice",
    );

    // The same directory twice, and no other: said, beside the shard that is missing.
    let o = merge(vec![a.clone(), a.clone()]).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains(&format!(
            "note: {} is given twice: it is merged once",
            a.display()
        )) && err.contains("shard 2/2: no directory given"),
        "{}",
        said(&o)
    );

    // Another shard count.
    let of_three = tmp.path().join("of-three");
    let o = run_shard(&suite, "2/3", &of_three, NONE).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), of_three]).await,
        "is a shard of 2 and",
    );

    // Edited suites.
    let edited = tmp.path().join("edited.kdl");
    std::fs::write(&edited, SMALL.replace("Hi, I'd", "Hello, I'd")).unwrap();
    let other = tmp.path().join("other");
    let o = run_shard(&edited, "2/2", &other, NONE).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), other]).await,
        "the suite files differ",
    );

    // Another selection splits another plan.
    let filtered = tmp.path().join("filtered");
    let o = run_shard(
        &suite,
        "2/2",
        &filtered,
        &["--shard-costs", "none", "--filter", "three"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), filtered]).await,
        "split the plan differently",
    );

    // The same suite files given in another order (a glob under another locale): named as
    // such, not as another selection.
    let ordered = tmp.path().join("ordered");
    std::fs::create_dir_all(&ordered).unwrap();
    std::fs::write(ordered.join("x.kdl"), SMALL).unwrap();
    std::fs::write(
        ordered.join("y.kdl"),
        "scenario \"four\" {\n    agent \"demo\"\n    user \"Hi\"\n}\n\
         scenario \"five\" {\n    agent \"demo\"\n    user \"Hello\"\n}\n",
    )
    .unwrap();
    let in_order = |files: [&str; 2], shard: &'static str, out: PathBuf| {
        let mut command = trellis();
        command
            .arg("run")
            .args(files.map(|f| ordered.join(f)))
            .args([
                "--shard",
                shard,
                "--quiet",
                "--shard-costs",
                "none",
                "--out",
            ])
            .arg(out);
        command.output()
    };
    let xy = tmp.path().join("xy");
    let yx = tmp.path().join("yx");
    let o = in_order(["x.kdl", "y.kdl"], "1/2", xy.clone())
        .await
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", said(&o));
    let o = in_order(["y.kdl", "x.kdl"], "2/2", yx.clone())
        .await
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", said(&o));
    refused(
        &merge(vec![xy, yx]).await,
        "they loaded the same suites in another order (x, y in",
    );

    // Another verdict policy: a skipped check fails only the strict shard's trajectories.
    let strict = tmp.path().join("strict");
    let o = run_shard(
        &suite,
        "2/2",
        &strict,
        &["--shard-costs", "none", "--strict"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    refused(
        &merge(vec![a.clone(), strict]).await,
        "ran with --strict and",
    );

    // Another trellis (a shard restored from an older job's cache): its checks may have been
    // decided otherwise. Its journal says so in `run_started`.
    let older = tmp.path().join("older");
    let o = run_shard(&suite, "2/2", &older, &["--shard-costs", "none"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let version = format!("\"trellis_version\":\"{}\"", env!("CARGO_PKG_VERSION"));
    let text = crate::journal_text(&older);
    assert!(text.contains(&version), "{text}");
    std::fs::remove_file(older.join(crate::JOURNAL)).unwrap();
    std::fs::write(
        older.join(trellis_engine::record::PLAIN_JOURNAL_FILE),
        text.replacen(&version, "\"trellis_version\":\"0.0.1\"", 1),
    )
    .unwrap();
    refused(
        &merge(vec![a.clone(), older]).await,
        "by trellis 0.0.1: their checks may have been decided differently",
    );

    // The same directory named twice is one shard: a and b merge.
    let o = merge(vec![a.clone(), a.join("."), b]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    // Each report says what it covers: a shard its share, the merged run its shards.
    let page = |dir: &Path| std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(page(&a).contains("Shard 1 of 2 of a sharded run"));
    assert!(page(&tmp.path().join("out")).contains("Merged from 2 shards"));
}

#[tokio::test]
async fn merge_refuses_shards_that_read_other_rows_of_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = r#"
agent "demo" protocol="connexity" builtin="booking"
dataset "rows" path="rows.csv"
scenario "ds" for-each="rows" {
    row-id "{{ row.id }}"
    user "Hi, I'd like to book a duct cleaning, {{ row.name }} here."
    expect reply contains="postal code"
}
scenario "a" { user "Hi, I'd like to book a duct cleaning."; expect no-error }
scenario "b" { user "Hi, I'd like to book a duct cleaning."; expect no-error }
"#;
    // The same suite in two checkouts whose dataset was edited in between: the row ids are
    // the same, the rows are not.
    for (version, rows) in [
        ("v1", "A1,Alice\nA2,Bob\n"),
        ("v2", "A1,Alicia\nA2,Bobby\n"),
    ] {
        let dir = tmp.path().join(version);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("s.kdl"), suite).unwrap();
        std::fs::write(dir.join("rows.csv"), format!("id,name\n{rows}")).unwrap();
    }
    for (i, version) in [(1, "v1"), (2, "v2")] {
        let o = run_shard(
            &tmp.path().join(version),
            &format!("{i}/2"),
            &tmp.path().join(format!("shard{i}")),
            NONE,
        )
        .await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    }
    let o = trellis()
        .arg("merge")
        .arg(tmp.path().join("shard1"))
        .arg(tmp.path().join("shard2"))
        .arg("--out")
        .arg(tmp.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    let said = flat(&stderr(&o));
    assert!(said.contains("differently (ds["), "{said}");
    assert!(said.contains("dataset rows changed"), "{said}");
    assert!(!tmp.path().join("out").exists());
}

#[tokio::test]
async fn a_shard_that_cannot_be_known_exits_2_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let out = tmp.path().join("out");
    // Arguments, variables, what stderr says.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--shard", "4/3"], &[], "there is no shard 4 of 3"),
        (&["--shard", "0/3"], &[], "there is no shard 0 of 3"),
        (&["--shard", "1of3"], &[], "is not a shard"),
        (
            &["--shards", "3"],
            &[],
            "--shards 3 needs the index of this shard",
        ),
        (
            &[],
            &[("JOB_COMPLETION_INDEX", "1")],
            "not how many shards there are",
        ),
        (&[], &[("TRELLIS_SHARDS", "3")], "not which shard this is"),
        (
            &[],
            &[("JOB_COMPLETION_INDEX", "3"), ("TRELLIS_SHARDS", "3")],
            "there is no shard 4 of 3",
        ),
        (
            &[],
            &[("CI_NODE_INDEX", "0"), ("CI_NODE_TOTAL", "3")],
            "CI_NODE_INDEX=0 is not a shard index",
        ),
        (&[], &[("CI_NODE_INDEX", "2")], "CI_NODE_TOTAL is not"),
        (
            &["--shards", "4"],
            &[
                ("BUILDKITE_PARALLEL_JOB", "1"),
                ("BUILDKITE_PARALLEL_JOB_COUNT", "3"),
            ],
            "--shards 4 disagrees with BUILDKITE_PARALLEL_JOB_COUNT=3",
        ),
        (&["--shard-costs", "none"], &[], "this run is not sharded"),
        (
            &[],
            &[("TRELLIS_SHARD", "2/4")],
            "TRELLIS_SHARD=2/4 is set, but Trellis reads no such variable",
        ),
        (
            &["--shard", "1/2", "--baseline"],
            &[],
            "shard 1/2 (from --shard) runs part of the plan, so it cannot be compared with a \
             whole run; gate the merged run instead: `trellis merge SHARD_DIR… --out DIR \
             --baseline` (docs/sharding.md), or pass --shard 1/1 to run the whole plan",
        ),
        (
            &["--baseline"],
            &[("CI_NODE_INDEX", "2"), ("CI_NODE_TOTAL", "3")],
            "shard 2/3 (from CI_NODE_INDEX=2 and CI_NODE_TOTAL=3 (GitLab `parallel`)) runs part",
        ),
        (
            &["--shard", "1/2", "--baseline", "main-nightly"],
            &[],
            "`trellis merge SHARD_DIR… --out DIR --baseline main-nightly`",
        ),
        (
            &["--shard", "1/2", "--shard-costs", "nope"],
            &[],
            "no run `nope`",
        ),
    ];
    for (args, vars, needle) in cases {
        let mut cmd = trellis();
        cmd.arg("run")
            .arg(&suite)
            .arg("--out")
            .arg(&out)
            .args(*args);
        for (k, v) in *vars {
            cmd.env(k, v);
        }
        let o = cmd.output().await.unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?} {vars:?}: {}", said(&o));
        assert!(
            flat(&stderr(&o)).contains(needle),
            "{args:?} {vars:?}: {needle}: {}",
            said(&o)
        );
        assert!(!out.exists(), "{args:?} {vars:?} wrote {}", out.display());
    }

    // Runners that give both, each numbered its own way.
    for (vars, shard, from) in [
        (
            [("CI_NODE_INDEX", "1"), ("CI_NODE_TOTAL", "2")],
            "1/2",
            "CI_NODE_INDEX=1 and CI_NODE_TOTAL=2 (GitLab `parallel`)",
        ),
        (
            [
                ("BUILDKITE_PARALLEL_JOB", "1"),
                ("BUILDKITE_PARALLEL_JOB_COUNT", "2"),
            ],
            "2/2",
            "BUILDKITE_PARALLEL_JOB=1 and BUILDKITE_PARALLEL_JOB_COUNT=2 (Buildkite `parallelism`)",
        ),
    ] {
        let mut cmd = trellis();
        cmd.arg("run")
            .arg(&suite)
            .args(["--quiet", "--message-format", "json", "--out"])
            .arg(&out)
            .arg("--replace");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let o = cmd.output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
        assert!(
            stderr(&o).contains(&format!("shard {shard}, from {from}")),
            "{}",
            said(&o)
        );
        let last: serde_json::Value =
            serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
        assert_eq!(last["shard"], shard);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
        assert_eq!(
            meta["shard"]["index"].to_string() + "/" + &meta["shard"]["count"].to_string(),
            shard
        );
    }

    // The whole plan, whatever GitLab's node variables say: `--shard 1/1` asks for it (with a
    // baseline), and a `parallel: matrix` job's variables number its matrix, not shards.
    let gitlab = [("CI_NODE_INDEX", "2"), ("CI_NODE_TOTAL", "3")];
    for (args, job) in [
        (&["--shard", "1/1"][..], "eval 2/3"),
        (&[][..], "eval: [openai, gpt-4o]"),
    ] {
        let mut cmd = trellis();
        cmd.arg("run")
            .arg(&suite)
            .args(args)
            .args(["--message-format", "json", "--out"])
            .arg(&out)
            .arg("--replace")
            .envs(gitlab)
            .env("CI_JOB_NAME", job);
        let o = cmd.output().await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{args:?} {job}: {}", said(&o));
        assert!(!stderr(&o).contains("shard 2/3"), "{}", said(&o));
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
        assert!(meta.get("shard").is_none(), "{meta}");
        let last: serde_json::Value =
            serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
        // one, two and three twice: every trajectory run of the plan.
        assert_eq!(last["trajectories"], 4, "{last}");
        assert_eq!(last["shard"], serde_json::Value::Null, "{last}");
        let matrix = flat(&stderr(&o)).contains(
            "are those of GitLab `parallel: matrix` job `eval: [openai, gpt-4o]`, not a shard: \
             the whole plan runs",
        );
        assert_eq!(matrix, args.is_empty(), "{}", said(&o));
    }

    // A shard's directory resumed with --shard 1/1: it holds part of a plan, refused.
    let part = tmp.path().join("part");
    let o = run_shard(&suite, "1/2", &part, NONE).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .args(["--shard", "1/1", "--resume"])
        .arg(&part)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(
        flat(&stderr(&o)).contains("holds shard 1/2 of its run, and --shard says the whole plan"),
        "{}",
        said(&o)
    );
}

#[tokio::test]
async fn shards_are_balanced_by_the_latest_whole_run_and_agree_on_the_split() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let runs = tmp.path().join("runs");
    // Shards in a directory of their own, as the recipe writes them, find no whole run
    // there: said, with the flag that names one; `pinned` is looked for there too, and the
    // help names this flag.
    let o = run_shard(&suite, "1/2", &tmp.path().join("shards/1"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let note = flat(&stderr(&o));
    assert!(
        note.contains("note: no finished whole run of these suites in `")
            && note.contains("--shard-costs RUN names one"),
        "{note}"
    );
    let o = run_shard(
        &suite,
        "1/2",
        &tmp.path().join("shards/2"),
        &["--shard-costs", "pinned"],
    )
    .await;
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    let err = flat(&stderr(&o));
    assert!(
        err.contains("error: --shard-costs pinned:")
            && err.contains("(--shard-costs runs/RUN_ID)")
            && !err.contains("--baseline"),
        "{err}"
    );
    let whole = trellis()
        .arg("run")
        .arg(&suite)
        .args(["--quiet", "--out"])
        .arg(runs.join("whole"))
        .output()
        .await
        .unwrap();
    assert_eq!(whole.status.code(), Some(0), "{}", said(&whole));
    let whole_id = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(runs.join("whole/run.json")).unwrap(),
    )
    .unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = run_shard(&suite, "1/2", &runs.join("s1"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(
        stderr(&o).contains(&format!("balanced by the measured cost of run {whole_id}")),
        "{}",
        said(&o)
    );
    let plan = shard_plan(&runs.join("s1"));
    assert_eq!(plan["balance"]["by"], "measured_cost");
    assert_eq!(plan["balance"]["run_id"], whole_id.as_str());
    assert!(
        plan["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["cost"].as_u64().unwrap() > 0),
        "{plan}"
    );
    // The shard is not a whole run: the second shard is balanced by the same run, and
    // the two merge.
    let o = run_shard(&suite, "2/2", &runs.join("s2"), &[]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert_eq!(shard_plan(&runs.join("s2"))["digest"], plan["digest"]);
    let merged = trellis()
        .arg("merge")
        .arg(runs.join("s1"))
        .arg(runs.join("s2"))
        .arg("--out")
        .arg(runs.join("merged"))
        .output()
        .await
        .unwrap();
    assert_eq!(merged.status.code(), Some(0), "{}", said(&merged));
    let listed = super::history::runs_json(&runs).await;
    let dirs: Vec<&str> = listed.iter().map(|r| r["dir"].as_str().unwrap()).collect();
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    assert!(
        dirs.iter()
            .all(|d| d.ends_with("whole") || d.ends_with("merged")),
        "{dirs:?}"
    );
    // --shard-costs none and a named run.
    let o = run_shard(&suite, "1/2", &runs.join("n1"), &["--shard-costs", "none"]).await;
    assert!(
        stderr(&o).contains("balanced by trajectory count"),
        "{}",
        said(&o)
    );
    let o = run_shard(
        &suite,
        "1/2",
        &tmp.path().join("named"),
        &["--shard-costs", runs.join("whole").to_str().unwrap()],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert_eq!(
        shard_plan(&tmp.path().join("named"))["digest"],
        plan["digest"]
    );
    // A named run of other suites measured none of these scenarios: said, and counted.
    let other = tmp.path().join("other.kdl");
    std::fs::write(
        &other,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"elsewhere\" {\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .arg(&other)
        .args(["--quiet", "--out"])
        .arg(runs.join("other"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let o = run_shard(
        &suite,
        "1/2",
        &tmp.path().join("named-other"),
        &["--shard-costs", runs.join("other").to_str().unwrap()],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let said_o = flat(&stderr(&o));
    assert!(said_o.contains("measured none of the"), "{}", said(&o));
    assert!(
        said_o.contains("balanced by trajectory count"),
        "{}",
        said(&o)
    );
}

#[tokio::test]
async fn rate_budgets_are_divided_among_shards_unless_per_shard() {
    use trellis_testkit::llm::{FakeLlm, Reply, Rule};
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        Duration::from_millis(150),
        Reply::text("Hello."),
    )])])
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let suite = |per_shard: &str| {
        let mut text = format!(
            "provider \"p\" kind=\"openai\" base-url=\"{}\" model=\"m\" concurrency=6 \
             requests-per-minute=6000 {per_shard}\n\
             agent \"model\" protocol=\"openai\" provider=\"p\"\n\
             agent \"spare\" protocol=\"connexity\" builtin=\"booking\" concurrency=16 per-shard=#true\n",
            fake.base_url()
        );
        for i in 0..12 {
            text.push_str(&format!(
                "scenario \"s{i}\" {{\n    agent \"model\"\n    user \"Hi {i}\"\n    expect no-error\n}}\n"
            ));
        }
        text
    };
    // One shard of 3, so the other shards' scenarios do not run here: 4 scenarios, and a
    // concurrency of 6 divided into 2.
    let divided = tmp.path().join("divided.kdl");
    std::fs::write(&divided, suite("")).unwrap();
    let o = run_shard(
        &divided,
        "1/3",
        &tmp.path().join("d"),
        &["--shard-costs", "none"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(
        stderr(&o).contains(
            "rate budgets divided by 3 (write `per-shard #true` on a provider or agent to keep \
             its limits whole in every shard): provider \"p\" concurrency 6 -> 2, provider \"p\" \
             requests-per-minute 6000 -> 2000"
        ),
        "{}",
        said(&o)
    );
    // The builtin agent keeps its own (`per-shard #true`).
    assert!(!stderr(&o).contains("agent \"spare\""), "{}", said(&o));
    assert_eq!(
        fake.max_in_flight(),
        2,
        "the shard's share of the provider's concurrency"
    );

    let fake_calls = fake.calls();
    let whole = tmp.path().join("whole.kdl");
    std::fs::write(&whole, suite("per-shard=#true")).unwrap();
    let o = run_shard(
        &whole,
        "1/3",
        &tmp.path().join("w"),
        &["--shard-costs", "none"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(!stderr(&o).contains("rate budgets divided"), "{}", said(&o));
    assert_eq!(fake.calls() - fake_calls, 4);
    assert_eq!(
        fake.max_in_flight(),
        4,
        "every scenario of the shard at once"
    );

    // A budget smaller than the shard count: each shard keeps 1, and the run says so.
    let small = tmp.path().join("small.kdl");
    std::fs::write(&small, suite("").replace("concurrency=6", "concurrency=2")).unwrap();
    let o = run_shard(
        &small,
        "1/3",
        &tmp.path().join("s"),
        &["--shard-costs", "none"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(
        stderr(&o).contains(
            "warning: provider \"p\" concurrency 2 is less than one per shard: each of the 3 \
             shards keeps 1, so together they may use 3"
        ),
        "{}",
        said(&o)
    );

    // The setting is in the language table: `check --explain` and the editor know it.
    let explain = trellis()
        .args(["check", "--explain", "provider"])
        .output()
        .await
        .unwrap();
    assert!(stdout(&explain).contains("per-shard"), "{}", said(&explain));
}

#[tokio::test]
async fn a_shard_whose_journal_is_damaged_is_said_so_and_not_counted_as_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for (i, dir) in [(1, &a), (2, &b)] {
        let o = run_shard(&suite, &format!("{i}/2"), dir, NONE).await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    }
    // An artifact damaged on its way down.
    let journal = trellis_engine::journal::find(&b).unwrap();
    std::fs::write(&journal, b"garbage\n").unwrap();
    let merge = |extra: &'static [&'static str]| {
        let (a, b, out) = (a.clone(), b.clone(), tmp.path().join("out"));
        async move {
            trellis()
                .arg("merge")
                .args([&a, &b])
                .arg("--out")
                .arg(out)
                .args(extra)
                .output()
                .await
                .unwrap()
        }
    };
    let o = merge(&[]).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    assert!(
        flat(&stderr(&o)).contains("its journal could not be read"),
        "{}",
        said(&o)
    );
    let o = merge(&["--allow-partial"]).await;
    assert!(stdout(&o).contains("merged 1 shard of 2"), "{}", said(&o));

    // One line lost inside a finished shard's journal (a node: a turn's records), the rest
    // intact: coverage cannot see it, and the merge says so instead of dropping it.
    let o = run_shard(&suite, "2/2", &b, &["--shard-costs", "none", "--replace"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let lines: Vec<String> = journal_text(&b).lines().map(str::to_owned).collect();
    let node = lines
        .iter()
        .position(|l| l.starts_with("{\"node\""))
        .expect("a node line");
    let journal = trellis_engine::journal::find(&b).unwrap();
    let mut writer = trellis_engine::journal::JournalWriter::create_at(&journal).unwrap();
    for (i, line) in lines.iter().enumerate() {
        let line = if i == node { "GARBAGE" } else { line.as_str() };
        writer.append_line(line.as_bytes()).unwrap();
    }
    writer.finish().unwrap();
    let o = merge(&[]).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    assert!(
        flat(&stderr(&o)).contains("1 line of its journal could not be read"),
        "{}",
        said(&o)
    );
    let o = merge(&["--allow-partial", "--replace"]).await;
    assert!(stdout(&o).contains("partial"), "{}", said(&o));

    // A shard killed while it wrote: no `run_finished`, its last line torn. That is what
    // it did not finish, said as such, not damage.
    let kept: Vec<&String> = lines
        .iter()
        .filter(|l| !l.starts_with("{\"run_finished\""))
        .collect();
    let mut writer = trellis_engine::journal::JournalWriter::create_at(&journal).unwrap();
    for line in &kept[..kept.len() - 1] {
        writer.append_line(line.as_bytes()).unwrap();
    }
    let last = kept[kept.len() - 1];
    writer
        .append_line(&last.as_bytes()[..last.len() / 2])
        .unwrap();
    writer.finish().unwrap();
    let o = merge(&["--replace"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    let said_now = flat(&stderr(&o));
    assert!(said_now.contains("its run did not finish"), "{}", said(&o));
    assert!(!said_now.contains("records are incomplete"), "{}", said(&o));

    // Every trajectory there, only the end lost (killed just after its last trajectory, or
    // the tail cut when copied): merged, and said.
    let mut writer = trellis_engine::journal::JournalWriter::create_at(&journal).unwrap();
    for line in &kept {
        writer.append_line(line.as_bytes()).unwrap();
    }
    writer.finish().unwrap();
    let o = merge(&["--replace"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(
        flat(&stderr(&o)).contains("warning: shard 2/2 (")
            && flat(&stderr(&o)).contains("its journal has no end"),
        "{}",
        said(&o)
    );
}

/// A shard's journal that records one trajectory twice (written twice by hand, or two
/// journals put end to end) is refused: merged, it counted the trajectory twice, more than
/// the plan holds, and passed.
#[tokio::test]
async fn merge_refuses_a_shard_that_records_a_trajectory_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for (i, dir) in [(1, &a), (2, &b)] {
        let o = run_shard(&suite, &format!("{i}/2"), dir, NONE).await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    }
    let lines: Vec<String> = journal_text(&a).lines().map(str::to_owned).collect();
    let trajectory = lines
        .iter()
        .position(|l| l.starts_with("{\"trajectory\""))
        .expect("a trajectory line");
    let journal = trellis_engine::journal::find(&a).unwrap();
    let mut writer = trellis_engine::journal::JournalWriter::create_at(&journal).unwrap();
    for (i, line) in lines.iter().enumerate() {
        writer.append_line(line.as_bytes()).unwrap();
        if i == trajectory {
            writer.append_line(line.as_bytes()).unwrap();
        }
    }
    writer.finish().unwrap();
    let o = trellis()
        .arg("merge")
        .args([&a, &b])
        .arg("--out")
        .arg(tmp.path().join("out"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(
        flat(&stderr(&o)).contains("is recorded twice in its journal"),
        "{}",
        said(&o)
    );
    assert!(!tmp.path().join("out/runs.parquet").exists());
}

/// `trellis runs` says a merge is one, and a merge stopped before it finished writing
/// (killed: no `runs.parquet`) unfinished, as it says of any run; it said "merged from 2
/// shards" of one that never finished.
#[tokio::test]
async fn runs_lists_a_merge_stopped_while_it_wrote_as_unfinished() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = small_suite(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for (i, dir) in [(1, &a), (2, &b)] {
        let o = run_shard(&suite, &format!("{i}/2"), dir, NONE).await;
        assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    }
    let runs = tmp.path().join("runs");
    let o = trellis()
        .arg("merge")
        .args([&a, &b])
        .arg("--out")
        .arg(runs.join("merged"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let listed = || {
        let runs = runs.clone();
        async move {
            let o = trellis()
                .arg("runs")
                .arg("--dir")
                .arg(&runs)
                .output()
                .await
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "{}", said(&o));
            stdout(&o)
        }
    };
    let shown = listed().await;
    assert!(shown.contains("merged from 2 shards"), "{shown}");
    std::fs::remove_file(runs.join("merged/runs.parquet")).unwrap();
    let shown = listed().await;
    assert!(shown.contains("unfinished"), "{shown}");
    assert!(!shown.contains("merged from"), "{shown}");
}

/// `merge --baseline` gates like `run --baseline`: the merged run is compared with the
/// baseline, `compare.json`/`compare.html` are written next to it (its page links them),
/// and the exit code is the comparison's: 0 for the same results, 1 on a regression.
#[tokio::test]
async fn merge_with_a_baseline_exits_by_the_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let suite = small_suite(tmp.path());
    let base = runs.join("base");
    let o = trellis()
        .arg("run")
        .arg(&suite)
        .args(["--quiet", "--out"])
        .arg(&base)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let merge = |suite: PathBuf, name: &'static str| {
        let tmp = tmp.path().to_owned();
        let runs = runs.clone();
        let base = base.clone();
        async move {
            let mut dirs = Vec::new();
            for i in 1..=2 {
                let out = tmp.join(format!("{name}/{i}"));
                let o = run_shard(&suite, &format!("{i}/2"), &out, NONE).await;
                assert!(o.status.code().is_some_and(|c| c <= 1), "{}", said(&o));
                dirs.push(out);
            }
            trellis()
                .arg("merge")
                .args(&dirs)
                .arg("--out")
                .arg(runs.join(name))
                .arg("--baseline")
                .arg(&base)
                .output()
                .await
                .unwrap()
        }
    };
    let same = merge(suite.clone(), "same").await;
    assert_eq!(same.status.code(), Some(0), "{}", said(&same));
    let merged = runs.join("same");
    assert!(merged.join("compare.json").is_file());
    let page = std::fs::read_to_string(merged.join("report.html")).unwrap();
    assert!(page.contains(r#"<a href="compare.html">"#));

    // `three` now fails where the baseline passed it: a regression.
    let worse = tmp.path().join("worse.kdl");
    std::fs::write(
        &worse,
        SMALL.replace("contains=\"$249\"", "contains=\"$999\""),
    )
    .unwrap();
    let regressed = merge(worse, "worse").await;
    assert_eq!(regressed.status.code(), Some(1), "{}", said(&regressed));
    let comparison: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runs.join("worse/compare.json")).unwrap())
            .unwrap();
    assert_eq!(comparison["regressed"], true, "{comparison}");

    // Under `--message-format json`, stdout is `run`'s event stream for the merged run,
    // ending with its verdict; the human summary goes nowhere near it.
    let o = trellis()
        .arg("merge")
        .arg(tmp.path().join("worse/1"))
        .arg(tmp.path().join("worse/2"))
        .args(["--message-format", "json", "--out"])
        .arg(runs.join("worse-json"))
        .arg("--baseline")
        .arg(&base)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let finished = lines.last().unwrap();
    assert_eq!(lines[0]["type"], "run_started", "{}", said(&o));
    assert_eq!(finished["type"], "run_finished");
    assert_eq!(finished["exit_code"], 1);
    assert_eq!(finished["regressed"], true);
    assert_eq!(finished["merged_shards"], 2);
    let trajectories = lines
        .iter()
        .filter(|l| l["type"] == "trajectory_finished")
        .count();
    assert_eq!(serde_json::json!(trajectories), finished["trajectories"]);
    assert!(stderr(&o).contains("merged 2 shards of 2"), "{}", said(&o));

    // A typo in the baseline fails before anything is merged.
    let o = trellis()
        .arg("merge")
        .arg(tmp.path().join("same/1"))
        .arg(tmp.path().join("same/2"))
        .args(["--baseline=no-such-run", "--out"])
        .arg(runs.join("never"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(!runs.join("never").exists());
}
