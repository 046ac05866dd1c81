//! `trellis init`: the project it writes for every protocol of the registry checks and runs
//! green at once against the protocol's builtin agent (`trellis check`, then `trellis run`
//! with no arguments in the new directory), its commented alternatives (your own endpoint,
//! the judge) load when uncommented, and it never overwrites what exists without `--force`.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use trellis_engine::protocol::registry;

use super::*;

/// `trellis ARGS` run in `dir`.
async fn trellis_in(dir: &Path, args: &[&str]) -> Output {
    trellis()
        .current_dir(dir)
        .args(args)
        .output()
        .await
        .unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The protocols `--protocol` takes: the registry's, every one of them.
fn protocols() -> Vec<&'static str> {
    let names: Vec<&str> = registry::specs().iter().map(|s| s.name).collect();
    // The list is the registry's; make sure it is the one the task is about, not empty.
    for expected in [
        "connexity",
        "agentscope",
        "a2a",
        "http",
        "multiagent",
        "fixie",
        "openai",
        "anthropic",
    ] {
        assert!(names.contains(&expected), "{expected} is not in {names:?}");
    }
    names
}

/// The counts of the one run under `dir/runs/`.
fn run_counts(dir: &Path) -> Value {
    let runs: Vec<_> = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let summary: Value = serde_json::from_str(&read(&runs[0].join("summary.json"))).unwrap();
    summary["stats"]["aggregates"]["counts"].clone()
}

#[tokio::test]
async fn every_protocol_gets_a_project_that_passes_at_once() {
    let root = tempfile::tempdir().unwrap();
    for protocol in protocols() {
        let dir = root.path().join(format!("{protocol}-evals"));
        let dir_arg = dir.to_str().unwrap();
        let out = trellis_in(root.path(), &["init", dir_arg, "--protocol", protocol]).await;
        assert_eq!(out.status.code(), Some(0), "{protocol}: {}", stderr(&out));
        let printed = stdout(&out);
        for file in [
            "suites/agents.kdl",
            "suites/smoke.kdl",
            ".github/workflows/trellis.yml",
            "README.md",
            ".gitignore",
        ] {
            assert!(dir.join(file).is_file(), "{protocol}: no {file}");
            assert!(
                printed.contains(file),
                "{protocol}: {file} not listed:\n{printed}"
            );
        }
        assert!(
            printed.contains(&format!("Next: cd {dir_arg} && trellis run")),
            "{printed}"
        );
        let builtin = registry::specs()
            .into_iter()
            .find(|s| s.name == protocol)
            .unwrap()
            .builtins[0];
        assert!(
            read(&dir.join("suites/agents.kdl"))
                .contains(&format!("protocol=\"{protocol}\" builtin=\"{builtin}\"")),
            "{protocol}"
        );
        let readme = read(&dir.join("README.md"));
        assert!(
            readme.contains(&format!("--protocol {protocol}"))
                && readme.contains(&format!("`{builtin}`"))
                && !readme.contains('%'),
            "{readme}"
        );
        // Every file written is in its table, the `.gitignore` too.
        assert!(readme.contains("| `.gitignore` |"), "{readme}");

        let check = trellis_in(&dir, &["check"]).await;
        assert_eq!(
            check.status.code(),
            Some(0),
            "{protocol}: {}",
            stderr(&check)
        );
        assert!(
            stdout(&check).starts_with("ok: 2 files, 1 suite"),
            "{}",
            stdout(&check)
        );
        assert!(
            stderr(&check).is_empty(),
            "{protocol} warns: {}",
            stderr(&check)
        );
        // What init writes is already laid out as `trellis fmt` would (the CI gate README
        // recommends).
        let fmt = trellis_in(&dir, &["fmt", "--check"]).await;
        assert_eq!(
            fmt.status.code(),
            Some(0),
            "{protocol}: {}{}",
            stdout(&fmt),
            stderr(&fmt)
        );

        // No arguments: `run` finds suites/ by itself.
        let run = trellis_in(&dir, &["run", "--quiet"]).await;
        assert_eq!(
            run.status.code(),
            Some(0),
            "{protocol}: {}{}",
            stdout(&run),
            stderr(&run)
        );
        let counts = run_counts(&dir);
        assert!(
            counts["passed"].as_u64().unwrap() >= 1,
            "{protocol}: {counts}"
        );
        assert_eq!(
            counts["passed"], counts["trajectories"],
            "{protocol}: {counts}"
        );
        assert_eq!(counts["skipped"], 0, "{protocol}: {counts}");
    }
}

/// What the user is told to do by the comments: put `//` before the builtin `agent` line and
/// remove it from the one below (with the `header` that sends a key), or uncomment the judge.
fn uncomment(text: &str, real_endpoint: bool) -> (String, usize) {
    let mut changed = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let body = line.trim_start();
            let indent = &line[..line.len() - body.len()];
            let uncommented = body.strip_prefix("// ");
            let switch = if real_endpoint {
                if body.starts_with("agent \"") {
                    Some(format!("{indent}// {body}"))
                } else {
                    uncommented
                        .filter(|b| b.starts_with("agent \"") || b.starts_with("header "))
                        .map(|b| format!("{indent}{b}"))
                }
            } else {
                uncommented
                    .filter(|b| b.starts_with("provider ") || b.starts_with("judge "))
                    .map(|b| format!("{indent}{b}"))
            };
            match switch {
                Some(new) => {
                    changed += 1;
                    new
                }
                None => line.to_owned(),
            }
        })
        .collect();
    (lines.join("\n"), changed)
}

#[tokio::test]
async fn the_commented_alternatives_load_once_uncommented() {
    let root = tempfile::tempdir().unwrap();
    for protocol in protocols() {
        for real_endpoint in [true, false] {
            let dir = root.path().join(format!(
                "{protocol}-{}",
                if real_endpoint { "real" } else { "judge" }
            ));
            let out = trellis_in(
                root.path(),
                &["init", dir.to_str().unwrap(), "--protocol", protocol],
            )
            .await;
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let mut changed = 0;
            for file in ["suites/agents.kdl", "suites/smoke.kdl"] {
                let path = dir.join(file);
                let (text, n) = uncomment(&read(&path), real_endpoint);
                std::fs::write(&path, text).unwrap();
                changed += n;
            }
            let agents = read(&dir.join("suites/agents.kdl"));
            if real_endpoint {
                // The builtin line commented, its alternative live: one endpoint, not builtin.
                assert!(changed >= 2, "{protocol}: {changed} lines switched");
                assert!(
                    !agents
                        .lines()
                        .any(|l| l.starts_with("agent ") && l.contains("builtin=")),
                    "{protocol}: {agents}"
                );
            } else {
                // The provider, the judge and the judged check.
                assert!(changed >= 3, "{protocol}: {changed} lines uncommented");
                assert!(agents.contains("\njudge \"default\""), "{protocol}");
            }
            let check = trellis_in(&dir, &["check"]).await;
            assert_eq!(
                check.status.code(),
                Some(0),
                "{protocol} ({}): {}",
                if real_endpoint {
                    "real endpoint"
                } else {
                    "judge"
                },
                stderr(&check)
            );
        }
    }
}

#[tokio::test]
async fn existing_files_are_listed_and_kept_unless_forced() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("evals");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("README.md"), "# mine\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "target").unwrap();
    std::fs::create_dir_all(dir.join(".github/workflows")).unwrap();
    std::fs::write(dir.join(".github/workflows/trellis.yml"), "mine").unwrap();

    let refused = trellis_in(&dir, &["init", "--protocol", "connexity"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    let err = stderr(&refused);
    assert!(
        err.contains("a file of the project already exists in the current directory")
            && err.contains(".github/workflows/trellis.yml")
            && !err.contains("README.md")
            && err.contains("--force"),
        "{err}"
    );
    // Nothing was written, not even the files that were free.
    assert!(!dir.join("suites").exists());
    assert_eq!(read(&dir.join("README.md")), "# mine\n");
    assert_eq!(read(&dir.join(".gitignore")), "target");

    // A repository's own README is not in the way: the project's goes next to the suites.
    std::fs::remove_file(dir.join(".github/workflows/trellis.yml")).unwrap();
    let kept = trellis_in(&dir, &["init", "--protocol", "connexity"]).await;
    assert_eq!(kept.status.code(), Some(0), "{}", stderr(&kept));
    assert_eq!(read(&dir.join("README.md")), "# mine\n");
    assert!(read(&dir.join("suites/README.md")).contains("trellis init --protocol connexity"));
    assert!(
        stdout(&kept).contains("suites/README.md"),
        "{}",
        stdout(&kept)
    );
    std::fs::remove_file(dir.join("suites/README.md")).unwrap();

    let forced = trellis_in(&dir, &["init", "--protocol", "connexity", "--force"]).await;
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert!(
        stdout(&forced).contains("(replaced)"),
        "{}",
        stdout(&forced)
    );
    assert!(
        stdout(&forced).contains("Next: trellis run"),
        "{}",
        stdout(&forced)
    );
    assert!(read(&dir.join("README.md")).contains("trellis init --protocol connexity"));
    // `.gitignore` is appended to, once, whatever it held.
    let again = trellis_in(&dir, &["init", "--protocol", "connexity", "--force"]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        read(&dir.join(".gitignore")),
        "target\n# Trellis run results (`trellis run`)\n/runs/\n"
    );

    // Run twice without --force: every file is in the way now.
    let twice = trellis_in(&dir, &["init", "--protocol", "openai"]).await;
    assert_eq!(twice.status.code(), Some(2));
    let err = stderr(&twice);
    for file in [
        "suites/agents.kdl",
        "suites/smoke.kdl",
        ".github/workflows/trellis.yml",
    ] {
        assert!(err.contains(file), "{file}: {err}");
    }
    assert!(read(&dir.join("suites/agents.kdl")).contains("protocol=\"connexity\""));

    // A file where the directory should be.
    std::fs::write(root.path().join("afile"), "").unwrap();
    let file = trellis_in(root.path(), &["init", "afile", "--protocol", "http"]).await;
    assert_eq!(file.status.code(), Some(2));
    assert!(
        stderr(&file).contains("afile is not a directory"),
        "{}",
        stderr(&file)
    );
}

#[tokio::test]
async fn a_missing_or_misspelt_protocol_is_a_usage_error_listing_them() {
    let root = tempfile::tempdir().unwrap();
    let missing = trellis_in(root.path(), &["init", "evals"]).await;
    assert_eq!(missing.status.code(), Some(2));
    let err = stderr(&missing);
    for protocol in protocols() {
        assert!(err.contains(protocol), "{protocol}: {err}");
    }
    let typo = trellis_in(root.path(), &["init", "evals", "--protocol", "opnai"]).await;
    assert_eq!(typo.status.code(), Some(2));
    let err = stderr(&typo);
    assert!(err.contains("a similar value exists: 'openai'"), "{err}");
    assert!(err.contains("anthropic"), "the list of protocols: {err}");
    // Neither wrote anything.
    assert!(!root.path().join("evals").exists());
}

#[tokio::test]
async fn a_project_in_a_repositorys_subdirectory_is_told_how_to_move_the_workflow() {
    let repo = tempfile::tempdir().unwrap();
    std::fs::create_dir(repo.path().join(".git")).unwrap();
    let o = trellis_in(
        repo.path(),
        &["init", "evals/bot", "--protocol", "connexity"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    // `working-directory` alone leaves the cache's `path: runs` at the root: the baseline
    // would never be restored and the gate could never fail.
    assert!(out.contains("working-directory: evals/bot"), "{out}");
    assert!(out.contains("`evals/bot/runs`"), "{out}");
    assert!(out.contains("evals/bot/${{ env.RUN_DIR }}"), "{out}");
}

/// `trellis run` in a directory not set up yet says how to start: the default `suites` is
/// missing, and `trellis init` writes it.
#[tokio::test]
async fn a_run_where_there_are_no_suites_says_init_starts_one() {
    let dir = tempfile::tempdir().unwrap();
    let o = trellis()
        .arg("run")
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o)
        .replace('\n', " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(err.contains("cannot read `suites`"), "{err}");
    assert!(
        err.contains("`trellis init` writes an example project"),
        "{err}"
    );
}

/// Suites holding agents alone: `run` says there is no scenario, not that a selection that
/// was never given matched nothing.
#[tokio::test]
async fn a_run_of_suites_without_scenarios_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("suites")).unwrap();
    std::fs::write(
        dir.path().join("suites/agents.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n",
    )
    .unwrap();
    let o = trellis()
        .arg("run")
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the suites hold no scenario"),
        "{}",
        stderr(&o)
    );
    // With a selection, that is what is said.
    let o = trellis()
        .args(["run", "--filter", "zz"])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert!(
        stderr(&o).contains("no scenario matches the selection"),
        "{}",
        stderr(&o)
    );
}

/// The workflow's first build, as GitHub runs it: the step that pins a baseline when none is
/// pinned, then the gated run. The step said `trellis runs pin baseline`, which names the
/// pinned run (none yet), not the directory it had just written: it failed on the first
/// build, and, as nothing was ever pinned, on every build after it.
#[tokio::test]
async fn the_workflows_first_build_pins_its_baseline_and_the_gate_compares_with_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("evals");
    let init = ["init", dir.to_str().unwrap(), "--protocol", "connexity"];
    let out = trellis_in(root.path(), &init).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let workflow = read(&dir.join(".github/workflows/trellis.yml"));
    let step = workflow
        .split("- name: Pin a baseline on the first build")
        .nth(1)
        .expect("the workflow has no step pinning a baseline");
    // The branch taken when nothing is pinned.
    let first_build: Vec<&str> = step
        .lines()
        .skip_while(|l| l.trim() != "else")
        .skip(1)
        .take_while(|l| l.trim() != "fi")
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    assert!(
        first_build.iter().any(|l| l.contains("runs pin")),
        "{first_build:?}"
    );
    let script = first_build
        .join("\n")
        .replace("${{ github.sha }}", "abc123");
    let bin = Path::new(env!("CARGO_BIN_EXE_trellis")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The word names the pinned run, not the directory: with nothing pinned it says so.
    let made = trellis_in(&dir, &["run", "--out", "runs/baseline"]).await;
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    let word = trellis_in(&dir, &["runs", "pin", "baseline"]).await;
    assert_eq!(word.status.code(), Some(2));
    assert!(
        stderr(&word).contains("write it as a path: `runs/baseline`"),
        "{}",
        stderr(&word)
    );

    let outputs = root.path().join("github-output");
    let mut bash = tokio::process::Command::new("bash");
    bash.current_dir(&dir)
        .env("PATH", path)
        .env("GITHUB_OUTPUT", &outputs)
        .args(["-euo", "pipefail", "-c", &script]);
    without_runner_shards(&mut bash);
    let o = bash.output().await.unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{script}\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    // The step tells the gated run to compare.
    assert_eq!(read(&outputs), "gate=--baseline\n");
    // As YAML, the workflow is what GitHub reads: the gated run takes the step's output, and
    // a pull request neither pins its own run nor saves its runs for the next build.
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&workflow).unwrap();
    let steps = yaml["jobs"]["evals"]["steps"].as_sequence().unwrap();
    let named = |name: &str| {
        steps
            .iter()
            .find(|s| s["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no step {name}"))
    };
    let pin = named("Pin a baseline on the first build")["run"]
        .as_str()
        .unwrap();
    let pull_request = pin
        .split("elif [ \"${{ github.event_name }}\" = pull_request ]; then")
        .nth(1)
        .and_then(|rest| rest.split("\nelse").next())
        .unwrap_or_else(|| panic!("no pull-request branch: {pin}"));
    assert!(pull_request.contains("::warning "), "{pull_request}");
    assert!(
        !pull_request.contains("runs pin") && !pull_request.contains("gate="),
        "{pull_request}"
    );
    assert!(
        named("Run the suites against the baseline")["run"]
            .as_str()
            .unwrap()
            .contains("${{ steps.baseline.outputs.gate }}")
    );
    assert_eq!(
        named("Keep the runs for the next build")["if"].as_str(),
        Some("always() && github.event_name != 'pull_request'")
    );

    let head = trellis_in(&dir, &["run", "--out", "runs/head", "--baseline"]).await;
    assert_eq!(
        head.status.code(),
        Some(0),
        "{}{}",
        stdout(&head),
        stderr(&head)
    );
    let listed = trellis_in(&dir, &["runs", "--json"]).await;
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let pinned: Vec<&Value> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["baseline"] == true)
        .collect();
    assert_eq!(pinned.len(), 1, "{runs}");
    assert!(
        pinned[0]["dir"].as_str().unwrap().ends_with("baseline"),
        "{runs}"
    );
}

/// The workflow installs one trellis commit per build and caches the binary under it, so
/// a newer trellis is installed (and cached) once it exists, instead of a stale cache hit
/// rebuilt on every build; on the default branch a build that passes the gate becomes the
/// baseline; and the runs kept are the baseline, this run and the last few (the history
/// the latency rule reads), run as GitHub runs the step.
#[tokio::test]
async fn the_workflow_pins_its_trellis_moves_its_baseline_and_keeps_recent_runs() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("evals");
    let init = ["init", dir.to_str().unwrap(), "--protocol", "connexity"];
    let out = trellis_in(root.path(), &init).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let workflow = read(&dir.join(".github/workflows/trellis.yml"));
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&workflow).unwrap();
    let steps = yaml["jobs"]["evals"]["steps"].as_sequence().unwrap();
    let named = |name: &str| {
        steps
            .iter()
            .find(|s| s["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no step {name}"))
    };
    assert_eq!(
        named("Cache the trellis binary")["with"]["key"].as_str(),
        Some("trellis-bin-${{ runner.os }}-${{ steps.trellis.outputs.rev }}")
    );
    assert!(
        named("Install trellis")["run"]
            .as_str()
            .unwrap()
            .contains("--rev \"${{ steps.trellis.outputs.rev }}\"")
    );
    let moved = named("Make this run the baseline");
    assert_eq!(moved["run"].as_str(), Some("trellis runs pin \"$RUN_DIR\""));
    let when = moved["if"].as_str().unwrap();
    assert!(
        when.starts_with("success() && github.event_name == 'push'")
            && when.contains("default_branch"),
        "{when}"
    );

    // Seven runs, the second pinned; the sixth is this build's.
    let mut made = Vec::new();
    for i in 0..7 {
        let name = format!("runs/r{i}");
        let o = trellis_in(&dir, &["run", "--out", &name, "-q"]).await;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        made.push(name);
    }
    let o = trellis_in(&dir, &["runs", "pin", "runs/r1"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let script = named("Keep the baseline, this run and the last few")["run"]
        .as_str()
        .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_trellis")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The step needs jq, as GitHub's runners have it: missing here, the test fails.
    let o = tokio::process::Command::new("bash")
        .current_dir(&dir)
        .env("PATH", path)
        .env("RUN_DIR", "runs/r5")
        .args(["-euo", "pipefail", "-c", script])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let mut left: Vec<String> = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('r'))
        .collect();
    left.sort();
    assert_eq!(left, ["r1", "r3", "r4", "r5", "r6"], "{}", stderr(&o));
}
