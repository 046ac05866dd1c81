//! Invalid suites: every problem reported at once, exit code 2, nothing run.

use super::*;

#[tokio::test]
async fn broken_suites_exit_2_with_every_error_located() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.kdl"),
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user "hi"
    expect reply contians="x"
}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("two.kdl"),
        r#"scenario "t" {
    agent "nobody"
    user "{{ user_context.missing }}"
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
    assert_eq!(o.status.code(), Some(2));
    assert!(!out.exists(), "nothing may run for an invalid suite");
    let err = stderr(&o);
    assert!(err.contains("one.kdl:4:"), "{err}");
    assert!(err.contains("contains"), "did-you-mean hint: {err}");
    assert!(err.contains("two.kdl:2:"), "{err}");
    assert!(err.contains("nobody"), "{err}");
    assert!(err.contains("missing"), "{err}");

    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
}

/// A scenario file of another tool given as a suite is named for what it is, with the
/// command that converts it, not parsed as KDL into a wall of syntax errors.
#[tokio::test]
async fn a_json_or_yaml_file_given_as_a_suite_points_to_trellis_import() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["scenario.json", "cases.YAML"] {
        let path = dir.path().join(name);
        std::fs::write(&path, r#"{"scenario_id": "x", "workflow": {"nodes": []}}"#).unwrap();
        let o = check(&path).await;
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(err.contains("is not a suite file"), "{err}");
        assert!(err.contains("trellis import multiagent"), "{err}");
        assert!(err.contains("1 error"), "{err}");
    }
}

/// A bound written with a value of the wrong type is one error, its own: not also "needs
/// `min=` or `max=`", which it has.
#[tokio::test]
async fn a_span_count_bound_of_the_wrong_type_is_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kdl");
    std::fs::write(
        &path,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    criteria {\n        span-count \"x\" max=\"3\"\n    }\n}\n",
    )
    .unwrap();
    let o = check(&path).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("1 error in"), "{err}");
    assert!(err.contains("expected an integer"), "{err}");
    // Neither bound at all is still said.
    std::fs::write(
        &path,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    criteria {\n        span-count \"x\"\n    }\n}\n",
    )
    .unwrap();
    let err = stderr(&check(&path).await);
    assert!(err.contains("needs `min=…` or `max=…`"), "{err}");
}

/// `check` says every problem at once: what it would warn about in the files without an
/// error is said with the errors, not once they are fixed; a file with an error warns of
/// nothing its error may have caused (a refused check leaves a scenario "checking nothing").
#[tokio::test]
async fn warnings_of_files_without_errors_are_said_with_the_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("good.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"unchecked\" {\n    agent \"a\"\n    user \"hi\"\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("bad.kdl"),
        "scenario \"bad\" {\n    agent \"nope\"\n    user \"hi\"\n    \
         expect reply matches=\"(\"\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("undefined agent `nope`"), "{err}");
    assert!(err.contains("scenario `unchecked` checks nothing"), "{err}");
    assert!(!err.contains("scenario `bad` checks nothing"), "{err}");
    // The errors come last, where the eye lands.
    assert!(
        err.find("checks nothing").unwrap() < err.find("undefined agent").unwrap(),
        "{err}"
    );
}

#[tokio::test]
async fn a_valid_suite_checks_ok() {
    let o = trellis().args(["check", "suites/"]).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ok:"));
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let o = trellis()
        .args(["run", "--jobs", "many"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = trellis()
        .args(["run", "suites/", "--filter", "no-such-scenario"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = trellis()
        .args(["run", "suites/", "--otlp-receiver", "collector:4318"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // Watch takes `localhost:PORT` as run does (here it goes on to the missing path).
    let w = trellis()
        .args([
            "watch",
            "/no/such/suites",
            "--otlp-receiver",
            "localhost:4318",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(w.status.code(), Some(2), "{}", stderr(&w));
    assert!(stderr(&w).contains("does not exist"), "{}", stderr(&w));
    assert!(
        stderr(&o).contains("give IP:PORT or localhost:PORT"),
        "{}",
        stderr(&o)
    );
    for bad in [
        &["bench", "--trajectories", "0"][..],
        &["bench", "--table", "--exe", "/no/such/trellis"],
    ] {
        let o = trellis().args(bad).output().await.unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
}

#[tokio::test]
async fn check_warns_about_what_cannot_run_yet_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        r#"agent "chat" protocol="connexity" builtin="booking"
agent "calc" protocol="fixie" url="http://127.0.0.1:9/"
agent "tool-loop" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m"
agent "proc" protocol="multiagent" command="./agent"
scenario "talk" {
    agents "chat" "calc"
    user "hi"
    expect judge "The agent is polite"
    branch "simulated" { simulate turns=2 }
    branch "scripted" { user "bye" }
    outcome "The customer is greeted"
}
scenario "llm" {
    agents "tool-loop" "proc"
    user "hi"
}
"#,
    )
    .unwrap();
    let o = check(dir.path()).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    for expected in [
        "s.kdl:7:",
        "cannot run yet on this agent",
        "`calc`",
        "s.kdl:8:",
        "this `judge` check will be skipped",
        "s.kdl:9:",
        "`simulate` needs the LLM user simulator",
        "s.kdl:11:",
        "this `outcome` check will be skipped",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    // talk: 2 trajectories × 2 agents, of which `simulated` (both agents) and `scripted` on
    // calc cannot run; llm: 1 trajectory × 2 agents, both runnable (`openai` runs its tool
    // loop, `proc` runs). The runnable `scripted` on chat skips the judge and the outcome.
    let out = stdout(&o);
    assert!(
        !err.contains("agent `tool-loop` cannot run yet"),
        "openai agents run: {err}"
    );
    assert!(
        out.contains("warning: 3 of 6 trajectory runs (per agent) cannot run yet and 2 checks will be skipped"),
        "{out}"
    );
    // Trajectories that cannot run, and no check of a runnable one skipped: no "0 checks".
    std::fs::write(
        dir.path().join("s.kdl"),
        r#"agent "demo" protocol="connexity" builtin="booking"
scenario "s" {
    simulate until-done
    expect no-error
}
"#,
    )
    .unwrap();
    let o = check(dir.path()).await;
    let out = stdout(&o);
    assert!(
        out.contains(
            "warning: 1 of 1 trajectory run (per agent) cannot run yet; see the 1 warning above"
        ),
        "{out}"
    );
}

/// A `ttft` check against an agent that never streams can only be skipped: `check` says so
/// where it is written.
#[tokio::test]
async fn check_warns_about_ttft_on_an_agent_that_does_not_stream() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect ttft max=\"1s\"\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("this `ttft` check will be skipped on agent `c`"),
        "{err}"
    );
    assert!(err.contains("t.kdl:4:"), "{err}");
}

/// `state` and `violations` read the tool sandbox, which only MultiAgentEval agents have:
/// `check` says where such a check will be skipped, and is quiet on a multiagent agent.
#[tokio::test]
async fn check_warns_about_sandbox_checks_on_agents_without_a_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"m\" protocol=\"multiagent\" url=\"http://127.0.0.1:9/execute_task\"\n\
         scenario \"s\" {\n    agent \"c\"\n    user \"hi\"\n    expect violations max=0\n}\n\
         scenario \"t\" {\n    agent \"m\"\n    user \"hi\"\n    criteria { state path=\"a\" exists=#true }\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("this `violations` check will be skipped on agent `c`"),
        "{err}"
    );
    assert!(
        err.contains("t.kdl:6:") && err.contains("no tool sandbox"),
        "{err}"
    );
    assert!(!err.contains("`state` check"), "{err}");
}

/// A `hitl` step answers an agent waiting for a human, which only MultiAgentEval agents do:
/// `check` says so where it is written on another agent, and is quiet on a multiagent one.
#[tokio::test]
async fn check_warns_about_hitl_on_agents_that_never_pause() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"m\" protocol=\"multiagent\" builtin=\"support\"\n\
         scenario \"s\" {\n    agent \"c\"\n    user \"hi\"\n    hitl approve\n    expect no-error\n}\n\
         scenario \"t\" {\n    agent \"m\"\n    user \"hi\"\n    hitl approve\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("scenario `s`: this `hitl` step has no effect on agent `c`"),
        "{err}"
    );
    assert!(err.contains("t.kdl:6:"), "{err}");
    assert!(!err.contains("scenario `t`"), "{err}");
}

/// The simulator's prompt templates are checked like every other template: a syntax error in
/// a branch's `system-prompt` and an unknown variable in the project's `opening-prompt` are
/// located diagnostics, exit code 2.
#[tokio::test]
async fn simulator_prompt_templates_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("sim.kdl"),
        r#"agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
simulator provider="p" {
    opening-prompt "Start as {{ persna.type }}."
}
scenario "s" {
    simulate turns=1
    branch "b" {
        simulator system-prompt="You are {{ persona.type "
        simulate turns=1
    }
    branch "c" { simulate turns=1; }
}
"#,
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("template_syntax"), "{err}");
    assert!(err.contains("sim.kdl:9:"), "{err}");
    assert!(
        err.contains("undefined template variable `persna.type`"),
        "{err}"
    );
    assert!(err.contains("sim.kdl:4:"), "{err}");
    assert!(err.contains("did you mean `persona.type`"), "{err}");
}

/// A simulator's templates see the names of the scenario it is written in, and the
/// project's see the fields every persona and scenario has: a misspelt field passed `check`
/// and failed every simulated turn of the run.
#[tokio::test]
async fn simulator_templates_are_checked_against_the_names_they_will_see() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("sim.kdl"),
        r#"agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9/v1" model="m"
persona "pp" type="t"
simulator provider="p" system-prompt="{{ user_context.anything }} {{ scenario.nme }}" opening-prompt="{{ persona.bogus }}"
scenario "s" {
    persona "pp"
    user-context {
        city "X"
    }
    simulator instructions="{{ persona.typo }} {{ user_context.bar }} {{ persona.type }} {{ user_context.city }}"
    user "hi"
    simulate turns=1
    expect reply contains="x"
}
scenario "no-persona" {
    simulator {
        system-prompt "{% if persona is not none %}You are {{ persona.type }}.{% endif %} End with {{ end_marker }}."
    }
    user "hi"
    simulate turns=1
    expect reply contains="x"
}
scenario "unguarded" {
    simulator instructions="Play {{ persona.type }}."
    user "hi"
    branch "with" {
        persona "pp"
        simulate turns=1
        expect reply contains="x"
    }
    branch "without" {
        simulate turns=1
        expect reply contains="x"
    }
}
"#,
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    for (var, help) in [
        ("scenario.nme", "did you mean `scenario.name`?"),
        ("persona.bogus", "`persona` has:"),
        ("persona.typo", "did you mean `persona.type`?"),
        ("user_context.bar", "`user_context` has: `city`"),
    ] {
        assert!(
            err.contains(&format!("undefined template variable `{var}`")),
            "{var}: {err}"
        );
        assert!(err.contains(help), "{help}: {err}");
    }
    // The project's simulator serves scenarios with other contexts: not judged there. And
    // `persona` is `none` in a scenario without one: a prompt may guard it.
    assert!(
        !err.contains("undefined template variable `user_context.anything`"),
        "{err}"
    );
    // Unguarded where a branch has no persona (a branch with one used the layer first).
    assert!(
        err.contains("this scenario (or branch) has no persona") && err.contains("sim.kdl:24:37"),
        "{err}"
    );
    assert!(err.contains("5 errors"), "{err}");
}

#[tokio::test]
async fn check_warns_about_an_env_variable_that_is_not_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("unused.kdl"),
        "agent \"unused\" protocol=\"connexity\" url=\"http://127.0.0.1:1/\" {\n    \
         header \"X-Token\" \"{{ env.TRELLIS_TEST_UNUSED_AGENT_VAR }}\"\n}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("env.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    agent \"c\"\n    user \"token {{ env.TRELLIS_TEST_UNSET_VAR }}\"\n    \
         user \"again {{ env.TRELLIS_TEST_UNSET_VAR }} {{ env.TRELLIS_TEST_SET_VAR }}\"\n    \
         expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env_remove("TRELLIS_TEST_UNSET_VAR")
        .env("TRELLIS_TEST_SET_VAR", "x")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "a warning, not an error");
    let err = stderr(&o);
    assert!(err.contains("trellis::unset_env"), "{err}");
    assert!(
        err.contains("environment variable `TRELLIS_TEST_UNSET_VAR` is not set"),
        "{err}"
    );
    assert!(err.contains("env.kdl:4:"), "first use, located: {err}");
    // An agent no scenario runs against never sends its headers.
    assert!(!err.contains("TRELLIS_TEST_UNUSED_AGENT_VAR"), "{err}");
    assert!(err.contains("1 more place"), "{err}");
    assert_eq!(
        err.matches("is not set").count(),
        1,
        "one warning per variable: {err}"
    );

    // Set, there is nothing to say.
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env("TRELLIS_TEST_UNSET_VAR", "now set")
        .env("TRELLIS_TEST_SET_VAR", "x")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(!stderr(&o).contains("unset_env"), "{}", stderr(&o));
}

/// A provider's `api-key-env` unset where `check` runs: every call through it would fail at
/// run time, so `check` says so at the variable's name (a warning: CI may set it later).
#[tokio::test]
async fn an_unset_api_key_variable_is_a_warning_at_its_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("key.kdl"),
        "provider \"hosted\" kind=\"openai\" model=\"m\" api-key-env=\"TRELLIS_TEST_UNSET_KEY\"\n\
         judge \"j\" provider=\"hosted\"\n\
         agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    criteria {\n        judge \"is polite\"\n    }\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env_remove("TRELLIS_TEST_UNSET_KEY")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "a warning, not an error");
    let err = stderr(&o);
    assert!(err.contains("trellis::unset_env"), "{err}");
    assert!(
        err.contains("`TRELLIS_TEST_UNSET_KEY` (the API key of provider"),
        "{err}"
    );
    assert!(err.contains("through `hosted` fails without it"), "{err}");
    assert!(err.contains("key.kdl:1:"), "located at the name: {err}");

    // Set but empty, as a CI secret a pull request from a fork cannot read: the run
    // refuses it as a missing key, so `check` warns too.
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env("TRELLIS_TEST_UNSET_KEY", "")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "a warning, not an error");
    let err = crate::flat(&stderr(&o));
    assert!(
        err.contains("`TRELLIS_TEST_UNSET_KEY` (the API key of provider `hosted`) is empty"),
        "{err}"
    );
    assert!(err.contains("cannot read is empty"), "{err}");

    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env("TRELLIS_TEST_UNSET_KEY", "sk-test")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(!stderr(&o).contains("unset_env"), "{}", stderr(&o));
}

/// A read of an unset variable with a fallback (`| default(…)`, `is defined`) renders without
/// it: `check` does not warn that it fails at run time, and the run renders the fallback.
#[tokio::test]
async fn an_unset_env_variable_read_with_a_default_is_not_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("env.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    agent \"c\"\n    \
         user \"zone {{ env.TRELLIS_TEST_DEFAULTED | default('V5K 0A1') }}\"\n    \
         expect no-error\n\n\n    user \"{{ env.TRELLIS_TEST_BARE }}\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .env_remove("TRELLIS_TEST_DEFAULTED")
        .env_remove("TRELLIS_TEST_BARE")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(
        err.contains("environment variable `TRELLIS_TEST_BARE` is not set"),
        "{err}"
    );
    assert!(!err.contains("`TRELLIS_TEST_DEFAULTED`"), "{err}");
    assert_eq!(err.matches("is not set").count(), 1, "{err}");

    // What check says holds: with only the bare one set, the run renders the default.
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .env_remove("TRELLIS_TEST_DEFAULTED")
        .env("TRELLIS_TEST_BARE", "now")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let journal = crate::journal_text(&out);
    assert!(journal.contains("\"zone V5K 0A1\""), "{journal}");
}

#[tokio::test]
async fn an_empty_directory_or_suite_file_is_an_error_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let empty_dir = dir.path().join("nothing");
    std::fs::create_dir(&empty_dir).unwrap();
    std::fs::write(empty_dir.join("notes.txt"), "not a suite").unwrap();
    for command in ["check", "run"] {
        let o = trellis()
            .arg(command)
            .arg(&empty_dir)
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{command}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(err.contains("no .kdl files under"), "{command}: {err}");
        assert!(err.contains("nothing"), "names the directory: {err}");
    }

    let empty_file = dir.path().join("empty.kdl");
    std::fs::write(&empty_file, "// only a comment\n").unwrap();
    let o = trellis()
        .arg("check")
        .arg(&empty_file)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("empty.kdl` holds no suite"), "{err}");

    // Beside a suite, an empty file (one just created in an editor) is a warning on that
    // file: the suite still checks and runs (it stopped every rerun of `trellis watch`).
    std::fs::write(
        dir.path().join("real.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("real.kdl"))
        .arg(&empty_file)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = flat(&stderr(&o));
    assert!(err.contains("trellis::empty_file"), "{err}");
    assert!(err.contains("empty.kdl:1:1"), "{err}");
}

/// A file nested far deeper than any suite (or one huge block comment) overflowed the
/// parser's stack and aborted the process (exit 134), and an error on a line longer than
/// 65,535 columns panicked: each must be a located diagnostic.
#[tokio::test]
async fn absurdly_deep_nesting_is_a_diagnostic_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {}{}\n",
        "x {\n".repeat(100_000),
        "}\n".repeat(100_000)
    );
    std::fs::write(dir.path().join("deep.kdl"), deep).unwrap();
    let comment = format!("/* {} */\n", "*a".repeat(100_000));
    std::fs::write(dir.path().join("comment.kdl"), comment).unwrap();
    let close = format!("suite \"s\"\nagent \"a\" {} {{ }} }}\n", "x".repeat(70_000));
    std::fs::write(dir.path().join("close.kdl"), close).unwrap();
    for (file, expected, code) in [
        ("deep.kdl", "deep.kdl:130:", "trellis::too_deep"),
        ("comment.kdl", "comment.kdl:1:1", "trellis::too_deep"),
        // An error past column 65,535 panicked inside miette's drawing of the line.
        ("close.kdl", "close.kdl:2:", "trellis::kdl_syntax"),
    ] {
        for command in ["check", "run"] {
            let mut cmd = trellis();
            cmd.arg(command).arg(dir.path().join(file));
            if command == "run" {
                cmd.arg("--out").arg(dir.path().join("out"));
            }
            let o = cmd.output().await.unwrap();
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{command} {file}: {err}");
            assert!(err.contains(code), "{err}");
            assert!(!err.contains("panicked"), "{err}");
            assert!(err.contains(expected), "{err}");
        }
    }
}

/// A `/-` right after another `/-` is a syntax error the KDL parser recovers from by
/// rescanning the rest of the node, so `check` on a line of a few thousand of them ran for
/// minutes (the dsl fuzz run's watchdog fired on one); it is refused at once, located.
#[tokio::test]
async fn slashdash_after_slashdash_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slashdash.kdl");
    let text = format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {{\n  user \"hi\" {}\n}}\n",
        "/- /- x ".repeat(2_000)
    );
    std::fs::write(&path, text).unwrap();
    let o = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        trellis().arg("check").arg(&path).output(),
    )
    .await
    .expect("check ended within 20 s")
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("trellis::too_deep"), "{err}");
    assert!(err.contains("`/-` right after another"), "{err}");
    assert!(err.contains("slashdash.kdl:3:16"), "{err}");
}

/// Files over 1 MiB were refused (`trellis::too_deep`); a generated suite of several MiB must
/// be checked like any other, and a problem in its last scenario located in the file.
#[tokio::test]
async fn a_suite_of_several_megabytes_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut text =
        String::from("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nsuite \"big\"\n");
    let scenarios = 2_000;
    let padding = "generated to make a large file; ".repeat(40);
    for i in 0..scenarios {
        text.push_str(&format!(
            "scenario \"s-{i}\" {{\n    name \"Scenario {i}, {padding}\"\n    user \"Hello, I would like to book a duct cleaning\"\n    expect reply contains=\"book\"\n}}\n"
        ));
    }
    assert!(text.len() > 2 * 1024 * 1024);
    let good = dir.path().join("big.kdl");
    std::fs::write(&good, &text).unwrap();
    let o = trellis().arg("check").arg(&good).output().await.unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.contains(&format!("{scenarios} scenarios")), "{out}");

    let bad = dir.path().join("bad.kdl");
    std::fs::write(
        &bad,
        format!("{text}scenario \"last\" {{ colour \"red\" }}\n"),
    )
    .unwrap();
    let o = trellis().arg("check").arg(&bad).output().await.unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = text.lines().count() + 1;
    assert!(err.contains(&format!("bad.kdl:{line}:19")), "{err}");
}

#[tokio::test]
async fn check_explains_a_node_of_the_language_from_its_table() {
    let o = trellis()
        .args(["check", "--explain", "scenario.agent-branches"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("agent-branches\n"), "{text}");
    assert!(text.contains("breadth="), "{text}");
    assert!(text.contains("depth="), "{text}");

    let o = trellis()
        .args(["check", "--explain", "branch"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for child in ["user MESSAGE", "branch NAME", "simulator", "persona"] {
        assert!(text.contains(child), "{child}: {text}");
    }

    let o = trellis()
        .args(["check", "--explain", "scenario.brnch"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `branch`?"),
        "{}",
        stderr(&o)
    );

    // An agent setting some protocols take is explained from their tables, each protocol's
    // meaning apart (it was "`agent` takes no node `request`").
    let o = trellis()
        .args(["check", "--explain", "agent.request"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    for said in [
        "agent setting of protocol `multiagent`:",
        "one of `full`, `task-only`",
        "agent setting of protocol `http`:",
        "the request body",
        // A turn template's scope names what every template reads too.
        "besides what every template reads (`user_context`",
    ] {
        assert!(text.contains(said), "{said}: {text}");
    }
    // Bare, as `branch` is found below the top level.
    let o = trellis()
        .args(["check", "--explain", "request"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("agent setting of protocol `http`:"),
        "{}",
        stdout(&o)
    );
}

/// A setting only another protocol takes is an error naming the protocols that take it (from
/// the protocol registry), where it is written: `system-prompt` on a Connexity agent would
/// otherwise be silently ignored, and the suite author would believe the agent got it.
#[tokio::test]
async fn a_setting_of_another_protocol_is_an_error_naming_its_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite.kdl");
    std::fs::write(
        &suite,
        r#"agent "demo" protocol="connexity" builtin="booking" {
    system-prompt "You are terse."
}
scenario "s" {
    user "hi"
    expect no-error
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    // The report wraps the message at the terminal's width.
    assert!(
        err.contains("`system-prompt` is a setting of `openai` and `anthropic` agents;"),
        "{err}"
    );
    assert!(err.contains("`demo` is `connexity`"), "{err}");
    assert!(err.contains("suite.kdl:2:5"), "{err}");
    assert!(err.contains("not a setting of this protocol"), "{err}");
}

/// A JSON path of nested filters (`$[?@.a[?@.a[?…`) took the path parser about four times
/// longer per level, so `check` on a path the dsl fuzz run generated ran for hours; such a
/// path, in a `capture`, a `reply` check or an `http` agent's `reply`, is refused at once,
/// located on the value, naming the limit.
#[tokio::test]
async fn deeply_nested_json_paths_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("paths.kdl");
    let nested = format!("$[?@.kins[0].parts{}", "[?@.kins[0].parts".repeat(24));
    let text = format!(
        "agent \"h\" protocol=\"http\" url=\"http://127.0.0.1:1/\" {{\n  \
         request #\"{{\"input\": {{{{ messages | tojson }}}}}}\"#\n  reply json-path=\"{nested}\"\n}}\n\
         scenario \"s\" {{\n  agent \"h\"\n  user \"hi\"\n  capture \"x\" json-path=\"{nested}\"\n  \
         expect reply json-path=\"{nested}\" equals=1\n}}\n"
    );
    std::fs::write(&path, text).unwrap();
    let o = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        trellis().arg("check").arg(&path).output(),
    )
    .await
    .expect("check ended within 20 s")
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("trellis::").count(), 4, "only the paths: {err}");
    assert_eq!(err.matches("trellis::too_deep").count(), 3, "{err}");
    assert!(err.contains("JSON path nested more than 8 deep"), "{err}");
    assert!(err.contains("at most 8 deep"), "{err}");
    for line in ["paths.kdl:3:19", "paths.kdl:8:25", "paths.kdl:9:26"] {
        assert!(err.contains(line), "{line}: {err}");
    }
}

/// After a multi-line raw string that is never closed, the KDL parser's error recovery tried
/// every later `#"""` again to the end of the file, so `check` on 3,000 of them (15 KB) ran
/// for over a minute; the loader refuses the first one at once, located.
#[tokio::test]
async fn an_unclosed_multi_line_string_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.kdl");
    let text = format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {{\n  user {}}}\n",
        "#\"\"\"\n".repeat(3_000)
    );
    std::fs::write(&path, text).unwrap();
    let o = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        trellis().arg("check").arg(&path).output(),
    )
    .await
    .expect("check ended within 20 s")
    .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("trellis::too_deep"), "{err}");
    assert!(err.contains("multi-line string not closed"), "{err}");
    assert!(err.contains("raw.kdl:3:8"), "{err}");
}

#[tokio::test]
async fn a_diagnostics_column_counts_characters_not_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("accents.kdl");
    // `é` is two bytes: a byte count would put the column 4 (then 8) too far.
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {\n    user \"éééé\" ; expect reply contans=\"x\"\n}\n\
         scenario \"t\" {\r\n    user \"ééééé\u{1F600}\" ; expect reply contans=\"y\"\r\n}\r\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("accents.kdl:3:32]"), "{err}");
    assert!(err.contains("accents.kdl:6:34]"), "{err}");
}

#[tokio::test]
async fn a_property_without_a_value_is_reported_where_the_value_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("novalue.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\nscenario \"u\" {\n    user \"y\"\n    expect reply contains=\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    // Not `novalue.kdl:1:1` with a label over the whole file.
    assert!(err.contains("novalue.kdl:5:27]"), "{err}");
    assert!(err.contains("a value must follow `=`"), "{err}");
}

#[tokio::test]
async fn empty_check_blocks_and_a_doubled_agent_are_each_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("empty.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect { }\n    criteria {\n    }\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    // A block written to check something and checking nothing is a mistake, as a bare
    // `expect` is; the doubled agent is one duplicate, not also "which agent?".
    assert!(err.contains("`expect` needs a criterion"), "{err}");
    assert!(err.contains("`criteria` needs a criterion"), "{err}");
    assert!(err.contains("duplicate agent `a`"), "{err}");
    assert!(!err.contains("does not say which agent"), "{err}");
    assert!(err.contains("3 errors"), "{err}");
}

#[tokio::test]
async fn a_file_that_is_not_utf8_and_an_included_directory_are_located() {
    let dir = tempfile::tempdir().unwrap();
    // A Latin-1 `é` (0xe9) on line 2.
    std::fs::write(
        dir.path().join("latin1.kdl"),
        b"agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {\n    user \"caf\xe9\"\n}\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("more")).unwrap();
    std::fs::write(dir.path().join("main.kdl"), "include \"more\"\n").unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("latin1.kdl:3:14]"), "{err}");
    assert!(err.contains("not UTF-8"), "{err}");
    assert!(err.contains("included path `more` is a directory"), "{err}");
}

#[tokio::test]
async fn a_bare_reply_check_gets_a_readable_hint() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect reply\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = flat(&stderr(&o));
    assert!(
        said.contains(
            "help: write `reply contains=\"…\"`, or `not-contains=`, `matches=`, `equals=`"
        ),
        "{said}"
    );
    assert!(!said.contains("``"), "{said}");
}

/// `history` opens the trajectory: written after a step, it is an error at its place (it
/// used to be accepted and sent first all the same).
#[tokio::test]
async fn a_history_after_the_first_step_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conv.json"),
        r#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]"#,
    )
    .unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"late\" {\n    user \"Hi, I'd like to book a duct cleaning.\"\n    \
         history path=\"conv.json\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("`history` must come before the scenario's steps")
            && said.contains("s.kdl:4:5"),
        "{said}"
    );
}

/// Every problem at once: a dataset that cannot be read and a typo no longer hide a bad
/// history and an instance's undefined variable until they are fixed.
#[tokio::test]
async fn dataset_schema_history_and_instance_errors_are_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "demo" protocol="connexity" builtin="booking"
dataset "d" path="nope.csv"
scenario "a" {
    user "Hi"
    expect reply contain="x"
}
scenario "u" {
    history #"[{"role":"bogus","content":"x"}]"#
    user "Hi"
    expect no-error
}
scenario "m" {
    matrix { tone "a" }
    user "Hi {{ vars.tone }}"
    expect judge "{{ vars.nope }}"
}
scenario "f" for-each="d" {
    user "Hi"
    expect no-error
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    for problem in [
        "4 errors in suite files",
        "nope.csv): cannot read the file",
        "unknown property `contain` on `reply`",
        "invalid history: message 1 has role `bogus`",
        "undefined template variable `vars.nope`",
    ] {
        assert!(said.contains(problem), "{problem}: {said}");
    }
}

/// A tool check that names a near miss of a declared tool, or a parameter the declared
/// tool lacks, is a warning with the name it means (`no-tool "aply_refund"` passes whatever
/// the agent does); a name nothing declared is close to is the agent's own tool, left
/// alone; the example suites have none.
#[tokio::test]
async fn tool_checks_naming_near_misses_of_declared_tools_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "s" protocol="multiagent" builtin="support"
tool "apply_refund" {
    param "order_id" required=#true
    param "amount" type="number" required=#true
}
scenario "s" {
    user "Refund $20 for order A-1001"
    expect tool "apply_refund" amout=20 cont=1
    expect tool "get_weather" city="Paris"
    expect tool "get_weather" city="Paris" Count=2
    expect tool "lookup_address" county="Kent"
    criteria { no-tool "aply_refund"; }
}
tool "step_1" { mock returns="{}" }
scenario "numbered" {
    user "Go"
    expect tool "step_2"
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    for warning in [
        "names a tool `aply_refund` the suite does not declare",
        "did you mean `apply_refund`?",
        "checks a parameter `amout` that tool `apply_refund` does not declare",
        "did you mean `amount`?",
        "did you mean `count=`",
        // The agent's own tool: any key is an argument, but a near miss of `count=` is
        // not one.
        "matches an argument `Count` of the call; the number of calls is `count=`",
    ] {
        assert!(said.contains(warning), "{warning}: {said}");
    }
    assert!(!said.contains("a tool `get_weather`"), "{said}");
    assert!(!said.contains("argument `city`"), "{said}");
    assert!(!said.contains("argument `county`"), "{said}");
    // Another member of a numbered family (`step_1`, `step_2`) is not a typo of it.
    assert!(!said.contains("a tool `step_2`"), "{said}");
    let o = trellis().args(["check", "suites/"]).output().await.unwrap();
    assert!(!stderr(&o).contains("unknown_tool"), "{}", stderr(&o));
}

/// A declared tool's mock or policy on a parameter the tool does not declare, or a mock
/// matching one with a value of another type, is a warning (it answers no call that sends
/// the declared arguments, or never applies); `null` matches anything and is left alone.
/// A parameter declared twice is an error.
#[tokio::test]
async fn mocks_and_policies_on_undeclared_or_mistyped_parameters_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    let text = r##"agent "s" protocol="multiagent" builtin="support"
tool "issue_refund" {
    param "order_id" type="string" required=#true
    param "amount" type="number"
    mock orderid="ORD-1" returns=#"{"ok": true}"#
    mock order_id="ORD-2" amount="45" returns=#"{"ok": true}"#
    mock order_id=1002 returns=#"{"ok": true}"#
    mock order_id=#null amount=12.5 returns=#"{"ok": true}"#
    policy "amont" max=50
    policy "amount" max=50
}
scenario "s" {
    user "Refund $20 for order A-1001"
    expect no-error
}
"##;
    std::fs::write(&suite, text).unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    for warning in [
        "a `mock` of tool `issue_refund` matches an argument `orderid` the tool does not \
         declare",
        "did you mean `order_id`?",
        "matches `amount` with the string \"45\", but `amount` is declared `type=\"number\"`",
        "write the value unquoted: amount=45",
        "matches `order_id` with the number 1002",
        "a `policy` of tool `issue_refund` is on `amont`, which the tool does not declare",
        "did you mean `amount`?",
    ] {
        assert!(said.contains(warning), "{warning}: {said}");
    }
    assert_eq!(said.matches("trellis::unknown_tool").count(), 4, "{said}");

    std::fs::write(
        &suite,
        text.replace(
            "param \"amount\" type=\"number\"",
            "param \"amount\" type=\"number\"\n    param \"order_id\" type=\"integer\"",
        ),
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("tool `issue_refund` declares parameter `order_id` twice"),
        "{said}"
    );
}

/// A `max-turns` below a path's scripted turns fails that path whatever the agent does,
/// and a `needs` on a draft skips its scenario every run: both are said at `check`.
#[tokio::test]
async fn max_turns_below_the_script_and_needs_on_a_draft_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "wip" {
    status "draft"
    user "hi"
    expect no-error
}
scenario "long" {
    max-turns 2
    needs "wip"
    user "one"
    branch "x" { user "two"; user "three"; }
    branch "y" { user "two"; }
    user "after"
    expect no-error
}
scenario "fits" {
    max-turns 3
    user "one"
    branch "x" { user "two"; }
    user "after"
    expect no-error
}
provider "fake" kind="openai" base-url="http://127.0.0.1:9/v1" model="m"
scenario "simulated" {
    max-turns 3
    user "one"
    branch "x" { simulate turns=4; }
    branch "y" { user "two"; }
    criteria { no-error }
}
scenario "until-done" {
    max-turns 3
    user "one"
    simulate until-done
    criteria { no-error }
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    for warning in [
        "scenario `long` scripts 4 agent turns on its longest path",
        "scenario `long` needs `wip`, which is a draft and does not run by default",
        // A fixed number of simulated turns past the limit is cut there, and passes.
        "scenario `simulated` asks for 5 agent turns on its longest path, its `simulate \
         turns=…` included",
    ] {
        assert!(said.contains(warning), "{warning}: {said}");
    }
    assert_eq!(said.matches("trellis::max_turns").count(), 2, "{said}");
}

/// A check written twice for one turn (or twice for the whole trajectory) is a warning: its
/// two results would be recorded alike. The same check on another turn, or in each branch
/// after a fork, is not.
#[tokio::test]
async fn a_check_written_twice_for_one_turn_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "demo" protocol="connexity" builtin="booking"
scenario "d" {
    user "Hi"
    expect {
        reply contains="postal"
        reply contains="postal"
    }
    user "again"
    expect reply contains="postal"
    branch "a" {
        expect no-error
    }
    branch "b" {
        expect no-error
    }
    user "after"
    expect reply contains="q"
    expect reply contains="q"
    criteria {
        tool "x"
        tool "x"
    }
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stderr(&o);
    // The steps after the branch group are walked on each branch's path: said once.
    assert_eq!(
        said.matches("trellis::duplicate_check").count(),
        3,
        "{said}"
    );
    assert!(
        said.contains("[s.kdl:6:9]") || said.contains("s.kdl:6:9"),
        "{said}"
    );
    assert!(said.contains("s.kdl:18:12"), "{said}");
    assert!(said.contains("s.kdl:21:9"), "{said}");
}

/// KDL v1's forms (bare `false`/`null`, `r"…"` raw strings) say how v2 writes them, not
/// only that an identifier was expected.
#[tokio::test]
async fn kdl_v1_forms_get_their_v2_spelling_as_the_hint() {
    let dir = tempfile::tempdir().unwrap();
    for (written, hint) in [
        ("stream=false", "`false` is written `#false`"),
        ("x=null", "`null` is written `#null`"),
        (r#"matches=r"\d+""#, r##"a raw string is written #"…"#"##),
    ] {
        let suite = dir.path().join("s.kdl");
        std::fs::write(
            &suite,
            format!("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nnode {written}\n"),
        )
        .unwrap();
        let o = check(&suite).await;
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let said = crate::flat(&stderr(&o));
        assert!(said.contains(hint), "{written}: {said}");
    }
}

/// A timeout of zero ends every call (or the trajectory) before it starts: an error at its
/// place, not a run of errors.
#[tokio::test]
async fn a_timeout_of_zero_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "agent \"demo\" protocol=\"connexity\" builtin=\"booking\" timeout=\"0s\"\n\
         scenario \"s\" {\n    timeout \"0ms\"\n    user \"Hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("2 errors")
            && said.contains("a timeout of zero")
            && said.contains("s.kdl:3:13"),
        "{said}"
    );
}

/// A typo naming an agent that exists but has an error of its own still gets `did you
/// mean`, not "no agent is defined".
#[tokio::test]
async fn a_typo_naming_a_broken_agent_is_still_suggested() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.kdl"),
        "agent \"demo\" protocol=\"connexity\" builtin=\"bookng\"\n\
         scenario \"s\" {\n    agent \"dmeo\"\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("did you mean `booking`?"), "{err}");
    assert!(err.contains("did you mean `demo`?"), "{err}");
    assert!(!err.contains("no agent is defined"), "{err}");
}

/// Syntax slips people make in KDL, each with a hint that names the fix: a `#` comment, a
/// raw string not closed, a `}` too many and one too few.
#[tokio::test]
async fn common_kdl_slips_get_a_hint_naming_the_fix() {
    let scenario = "scenario \"s\" {\n    user \"hi\"\n    expect no-error\n}\n";
    for (text, hint) in [
        (
            format!("# a comment\n{scenario}"),
            "comments in KDL are `// …`",
        ),
        (
            "scenario \"s\" {\n    user \"hi\"\n    expect reply matches=#\"\\d+\"\n}\n".to_owned(),
            "this raw string is not closed",
        ),
        (format!("{scenario}}}\n"), "this `}` closes no block"),
        (
            scenario.trim_end().trim_end_matches('}').to_owned(),
            "a `{` opened a block that is never closed",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.kdl"), &text).unwrap();
        let o = trellis()
            .arg("check")
            .arg(dir.path())
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{text}: {}", stderr(&o));
        let said = crate::flat(&stderr(&o));
        assert!(said.contains("trellis::kdl_syntax"), "{text}: {said}");
        assert!(said.contains(hint), "{text}: {said}");
        assert!(said.contains("s.kdl:"), "{text}: {said}");
    }
}

/// An agent's `cwd` that is not there is a warning at `check` (every call would fail as a
/// `setup` fault); one that is there says nothing.
#[tokio::test]
async fn an_agent_working_directory_that_is_not_there_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("agent")).unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "here" protocol="multiagent" command="python3 a.py" cwd="agent"
agent "gone" protocol="multiagent" command="python3 a.py" cwd="agnet"
scenario "s" { agents "here" "gone"; user "hi"; expect no-error; }
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("agent `gone`'s `cwd` is not a directory"),
        "{said}"
    );
    assert!(!said.contains("agent `here`'s"), "{said}");
}

/// `criteria-override` is a template the judge reads rendered: a variable it cannot read is
/// an error at `check`, where the judge was sent the text as written.
#[tokio::test]
async fn a_criteria_override_reading_an_undefined_variable_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("co.kdl"),
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user-context {
        city "X"
    }
    criteria-override "Override {{ user_context.nope }} {{ user_context.city }}"
    user "x"
    expect judge "ok"
}
"#,
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("undefined template variable `user_context.nope`"),
        "{err}"
    );
    assert!(err.contains("co.kdl:6:36"), "{err}");
    assert!(err.contains("`user_context` has: `city`"), "{err}");
}

/// A definition without its id (or with an empty one) still has its body read: its typos
/// were said only once the id was fixed, one round of `check` later.
#[tokio::test]
async fn a_definition_without_an_id_still_has_its_body_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ids.kdl"),
        "scenario \"\" {\n    usr \"x\"\n}\nagent \"\" protocol=\"conexity\"\ntool \"\" { parm \"x\" }\n\
         scenario {\n    user \"hi\"\n    expect reply contans=\"x\"\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    for said in [
        "`scenario` needs an id, not an empty one",
        "unknown node `usr`",
        "`agent` needs an id, not an empty one",
        "invalid protocol `conexity`",
        "`tool` needs a name, not an empty one",
        "unknown node `parm`",
        "`scenario` needs an id",
        "unknown property `contans`",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
}

/// A branch's `persona` or `simulator` written twice is an error (the second replaced the
/// first without a word), and a misspelt one is offered as what a branch takes.
#[tokio::test]
async fn a_branch_setting_written_twice_or_misspelt_is_said() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("b.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         persona \"p\" type=\"t\"\npersona \"q\" type=\"u\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect no-error\n    branch \"b\" {\n        \
         personna \"p\"\n        persona \"p\"\n        persona \"q\"\n        user \"x\"\n        \
         expect no-error\n    }\n    branch \"c\" {\n        user \"y\"\n        expect no-error\n    }\n}\n",
    )
    .unwrap();
    let o = check(dir.path()).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("`persona` is set twice in this branch"),
        "{err}"
    );
    assert!(err.contains("b.kdl:10:9"), "{err}");
    assert!(
        err.contains("unknown node `personna` in a `branch`")
            && err.contains("did you mean `persona`?"),
        "{err}"
    );
}

/// A path that never ends (`/dev/zero`), given or included, is refused at a size no suite
/// has, instead of being read until memory runs out; included, it is not "not found".
#[tokio::test]
async fn a_suite_path_that_never_ends_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let including = dir.path().join("z.kdl");
    std::fs::write(&including, "include \"/dev/zero\"\n").unwrap();
    for path in [Path::new("/dev/zero"), including.as_path()] {
        let o = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            trellis().arg("check").arg(path).output(),
        )
        .await
        .expect("refused in time")
        .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = crate::flat(&stderr(&o));
        assert!(err.contains("larger than 64 MiB"), "{err}");
        assert!(!err.contains("not found"), "{err}");
    }
}

/// Hidden files and directories under a suite directory are not loaded: an editor's local
/// history (`.history/`, with a copy of each saved file) loaded every suite twice, as
/// duplicate ids. A hidden file given by name is read.
#[tokio::test]
async fn hidden_files_under_a_directory_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let suite = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
                 scenario \"s\" {\n    agent \"a\"\n    user \"hi\"\n    expect no-error\n}\n";
    std::fs::write(dir.path().join("main.kdl"), suite).unwrap();
    std::fs::create_dir_all(dir.path().join(".history")).unwrap();
    std::fs::write(dir.path().join(".history/main_20261204.kdl"), suite).unwrap();
    std::fs::write(dir.path().join(".main.kdl"), suite).unwrap();
    let o = crate::check(dir.path()).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = crate::check(&dir.path().join(".main.kdl")).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A `branch` with no sibling is a fork of one: its steps run in sequence with the rest,
/// not as an alternative (an `expect` written between two branches splits them). Warned.
#[tokio::test]
async fn a_branch_without_a_sibling_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "split" {
    user "hi"
    branch "x" { user "one"; }
    expect no-error
    branch "y" { user "two"; }
    expect no-error
}
scenario "paired" {
    user "hi"
    branch "x" { user "one"; }
    branch "y" { user "two"; }
    expect no-error
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::lone_branch").count(), 2, "{said}");
    assert!(said.contains("`branch \"x\"` has no sibling"), "{said}");
    assert!(said.contains("s.kdl:4:"), "{said}");
}

/// A top-level name written in a block that takes a name a letter away (`tool` for an
/// agent's `tools`) says where it belongs and suggests the near name.
#[tokio::test]
async fn a_top_level_name_in_a_block_suggests_the_blocks_near_name() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "a" protocol="connexity" builtin="booking" {
    tool "get_order" "refund_order"
}
scenario "s" {
    user "hi"
    expect no-error
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("not here; did you mean `tools`, which this block takes?"),
        "{said}"
    );
}

/// A scenario, or a path through its branches, with no step that calls the agent is run
/// as skipped ("the agent was never called"): `check` warns where, not `ok` alone. One
/// that calls it on every path, that lets the agent speak first, or that starts from a
/// `history` (whose last user message is the first turn) is not warned.
#[tokio::test]
async fn a_scenario_that_never_calls_the_agent_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
scenario "empty" {
    criteria { no-error; }
}
scenario "forks" {
    branch "a" { user "hi"; }
    branch "b" { }
    criteria { no-error; }
}
scenario "after" {
    branch "a" { }
    branch "b" { }
    user "hello"
    criteria { no-error; }
}
scenario "opens" {
    first-turn "agent"
    criteria { no-error; }
}
scenario "recorded" {
    history #"[{"role": "user", "content": "hi"}]"#
    criteria { no-error; }
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("never calls the agent").count(), 2, "{said}");
    assert!(
        said.contains("scenario `empty` never calls the agent: no `user`"),
        "{said}"
    );
    assert!(
        said.contains("scenario `forks` never calls the agent on branch `b`"),
        "{said}"
    );
    assert!(said.contains("s.kdl:7:12"), "{said}");
}

/// A `simulator` or a branch `persona` that no `simulate` step under it plays changes
/// nothing: warned where it is written. Played ones are not.
#[tokio::test]
async fn a_simulator_or_persona_nothing_plays_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "demo" protocol="connexity" builtin="booking"
provider "local" kind="openai" model="m" base-url="http://127.0.0.1:9/v1"
persona "p" description="a user in a hurry"
scenario "s" {
    simulator instructions="book"
    user "hi"
    branch "a" {
        persona "p"
        simulator temperature=0.2
        user "x"
    }
    branch "b" {
        user "y"
    }
    expect no-error
}
scenario "played" {
    simulator instructions="book"
    user "hi"
    branch "a" {
        persona "p"
        simulate turns=1
    }
    branch "b" {
        user "y"
    }
    expect no-error
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::unplayed").count(), 3, "{said}");
    for at in ["s.kdl:5:5", "s.kdl:8:9", "s.kdl:9:9"] {
        assert!(said.contains(at), "{at}: {said}");
    }
    assert!(
        said.contains("this branch's `persona` is never played"),
        "{said}"
    );
    assert!(
        said.contains("this `simulator` is never used: no `simulate` step under it"),
        "{said}"
    );
}

/// A mock answer that starts like JSON but is not (a trailing comma) is answered as text:
/// warned, naming the parser's error. A `no-tool` naming a near miss of a tool the same
/// scenario checks was called passes whatever the agent does: warned, though no `tool`
/// node declares either. Text that is not JSON-like, and distinct names, are not.
#[tokio::test]
async fn a_broken_json_answer_and_a_no_tool_typo_of_a_checked_tool_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
tool "get_order" {
    mock returns=#"{"order_id": "A-1001", "status": "shipped",}"# order_id="A-1001"
    mock returns="[ERROR] no such order"
    mock returns=#"{"status": "unknown"}"#
}
scenario "booked" {
    user "Hi, I'd like to book a duct cleaning."
    expect tool "create_booking"
    criteria {
        no-tool "create_boking"
        no-tool "cancel_booking"
    }
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::not_json").count(), 1, "{said}");
    assert!(
        said.contains(
            "`returns` of tool `get_order` starts like JSON but is not JSON (trailing comma"
        ),
        "{said}"
    );
    assert!(said.contains("s.kdl:3:"), "{said}");
    assert_eq!(said.matches("trellis::unknown_tool").count(), 1, "{said}");
    assert!(
        said.contains("did you mean `create_booking`, which this scenario checks with `tool`?"),
        "{said}"
    );
    assert!(said.contains("s.kdl:11:"), "{said}");
}

/// A misspelt endpoint or dataset `path` is one error, its own: not also "agent has no
/// endpoint" (shown first, before the typo that caused it) or "undefined dataset" at the
/// `for-each` naming a dataset that is declared.
#[tokio::test]
async fn a_misspelt_endpoint_or_dataset_path_is_one_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rows.csv"), "q\nhi\n").unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "desk" protocol="connexity" bultin="booking"
dataset "rows" pth="rows.csv"
scenario "each" for-each="rows" {
    agent "desk"
    user "hi"
    expect no-error
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(said.contains("2 errors in suite files"), "{said}");
    assert!(said.contains("did you mean `builtin`?"), "{said}");
    assert!(said.contains("did you mean `path`?"), "{said}");
    assert!(!said.contains("has no endpoint"), "{said}");
    assert!(!said.contains("undefined dataset"), "{said}");
}

/// A `history` template reading a column the dataset lacks is one error, the template's
/// with the column meant, not also "invalid history" of every instance.
#[tokio::test]
async fn a_history_from_a_misspelt_column_is_one_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("convs.jsonl"),
        "{\"id\": \"c1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\
         {\"id\": \"c2\", \"messages\": [{\"role\": \"user\", \"content\": \"yo\"}]}\n",
    )
    .unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
dataset "convs" path="convs.jsonl"
scenario "replayed" for-each="convs" {
    agent "a"
    row-id "{{ row.id }}"
    history "{{ row.mesages }}"
    user "what did I ask"
    expect no-error
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(said.contains("1 error in suite files"), "{said}");
    assert!(said.contains("did you mean `row.messages`?"), "{said}");
    assert!(!said.contains("invalid history"), "{said}");
}

/// A CSV column typed differently from row to row (`02134` text, `10001` a number) is
/// warned of, naming the column, the counts and the first text field; a JSON Lines file's
/// own types are the author's, and are not.
#[tokio::test]
async fn a_csv_column_of_two_types_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("z.csv"),
        "id,zip,amount\na,02134,10\nb,10001,12.5\nc,94105,20\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("z.jsonl"),
        "{\"zip\": \"02134\"}\n{\"zip\": 10001}\n",
    )
    .unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
dataset "z" path="z.csv"
dataset "j" path="z.jsonl"
scenario "s" for-each="z" {
    user "zip {{ row.zip }}"
    expect no-error
}
scenario "t" for-each="j" {
    user "zip {{ row.zip }}"
    expect no-error
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::mixed_column").count(), 1, "{said}");
    assert!(
        said.contains(
            "column `zip` of dataset `z` reads as a number in 2 rows and as text in 1 row (row \
             1: `02134`)"
        ),
        "{said}"
    );
    assert!(said.contains("s.kdl:2:18"), "{said}");
}

/// `foreach=` is one error, the unknown property with the spelling meant: its `row-id` and
/// `row.*` are read as for `for-each=`, not each reported as reading no dataset.
#[tokio::test]
async fn a_misspelt_for_each_is_one_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rows.csv"), "id,q\n1,hi\n").unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
dataset "rows" path="rows.csv"
scenario "each" foreach="rows" {
    row-id "{{ row.id }}"
    user "{{ row.q }}"
    expect no-error
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(said.contains("1 error in suite files"), "{said}");
    assert!(said.contains("did you mean `for-each`?"), "{said}");
}

/// A typo in a `tools-in-order` of a tool the scenario checks elsewhere: the warning is at
/// the typo, with the spelling the other checks use; a `no-tool` spelt right, of a tool the
/// scenario checks was called, is not warned (it was, at the wrong line, with the typo as
/// the suggestion).
#[tokio::test]
async fn a_tools_in_order_typo_is_warned_at_the_typo() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
scenario "price" {
    user "How much is it?"
    expect {
        no-tool "quote_price"
    }
    user "My postal code is V5K 0A1."
    expect tool "quote_price"
    criteria {
        tools-in-order "check_service_area" "qoute_price"
    }
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::unknown_tool").count(), 1, "{said}");
    assert!(said.contains("s.kdl:10:9"), "{said}");
    assert!(
        said.contains("did you mean `quote_price`, as 2 other checks of this scenario write it?"),
        "{said}"
    );
    assert!(!said.contains("did you mean `qoute_price`"), "{said}");

    // A name and its plural are two tools an agent often has, not a slip.
    std::fs::write(
        &suite,
        r##"agent "a" protocol="connexity" builtin="booking"
scenario "orders" {
    user "What did I order?"
    expect tool "get_orders"
    expect tool "get_order"
    criteria {
        tools-in-order "get_orders" "check_service_area"
    }
}
"##,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(!said.contains("trellis::unknown_tool"), "{said}");
}

/// A scenario file `trellis import` converts, included as if it were a suite, is said to
/// be one (it was the KDL parser's "Found invalid node name"), as when it is given to the
/// command.
#[tokio::test]
async fn an_included_json_file_is_said_not_to_be_a_suite() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cases.json"), r#"{"scenarios": []}"#).unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        "include \"cases.json\"\nagent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert!(
        said.contains("included file `cases.json` is not a suite file"),
        "{said}"
    );
    assert!(said.contains("trellis import multiagent"), "{said}");
    assert!(!said.contains("kdl_syntax"), "{said}");
}

/// `check --message-format json`: each problem a JSON line on stdout with its file, line,
/// column and end, code, label and help, then a summary; the exit code is `check`'s.
#[tokio::test]
async fn check_writes_each_problem_as_a_json_line_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("one.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n    expect reply contians=\"x\"\n}\n\
         scenario \"t\" {\n    agent \"nobody\"\n    user \"hi\"\n    expect no-error\n}\n",
    )
    .unwrap();
    let o = trellis()
        .args(["check", "--message-format", "json"])
        .arg(dir.path().join("one.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let (summary, diagnostics) = lines.split_last().unwrap();
    assert_eq!(summary["type"], "summary", "{summary}");
    assert_eq!(summary["ok"], false, "{summary}");
    assert_eq!(summary["errors"], 2, "{summary}");
    let typo = diagnostics
        .iter()
        .find(|d| d["code"] == "trellis::unknown_property")
        .unwrap_or_else(|| panic!("{diagnostics:?}"));
    assert_eq!(typo["severity"], "error");
    assert!(
        typo["file"].as_str().unwrap().ends_with("one.kdl"),
        "{typo}"
    );
    // `contians="x"` on line 4, from column 18.
    assert_eq!(
        (typo["line"].as_u64(), typo["column"].as_u64()),
        (Some(4), Some(18)),
        "{typo}"
    );
    assert_eq!(typo["end_line"], 4, "{typo}");
    assert!(
        typo["help"].as_str().unwrap().contains("contains"),
        "{typo}"
    );
    let nobody = diagnostics
        .iter()
        .find(|d| d["message"].as_str().is_some_and(|m| m.contains("nobody")))
        .unwrap_or_else(|| panic!("{diagnostics:?}"));
    assert_eq!(
        (nobody["line"].as_u64(), nobody["column"].as_u64()),
        (Some(7), Some(11)),
        "{nobody}"
    );
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    // A valid suite: its warnings, and a summary that says it is fine.
    std::fs::write(
        dir.path().join("one.kdl"),
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"s\" {\n    user \"hi\"\n}\n",
    )
    .unwrap();
    let o = trellis()
        .args(["check", "--message-format", "json"])
        .arg(dir.path().join("one.kdl"))
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["code"], "trellis::no_checks", "{lines:?}");
    assert_eq!(lines[0]["severity"], "warning", "{lines:?}");
    let summary = lines.last().unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["scenarios"], 1, "{summary}");
    assert_eq!(summary["warnings"], 1, "{summary}");
}

/// A `turns max=N` below the turns scripted before it is checked fails whatever the agent
/// does: `check` warns, at the check, on every path where that is so, and not where it
/// can pass.
#[tokio::test]
async fn a_turns_check_below_the_scripted_turns_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user "hi"
    expect turns max=0
    user "more"
    expect turns max=2
    branch "x" {
        user "a"
        user "b"
        expect turns max=3
    }
    branch "y" {
        user "c"
        expect turns max=3
    }
    criteria {
        turns max=3
    }
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::never_passes").count(), 3, "{said}");
    assert!(
        said.contains(
            "`turns max=0` can never pass here: 1 agent turn is scripted before it is checked"
        ),
        "{said}"
    );
    assert!(said.contains("s.kdl:4:"), "{said}");
    assert!(said.contains("s.kdl:10:"), "{said}");
    assert!(!said.contains("s.kdl:6:"), "{said}");
    assert!(!said.contains("s.kdl:14:"), "{said}");
    assert!(
        said.contains("can never pass on the scenario's longest path: 4 agent turns"),
        "{said}"
    );
}

/// Two checks at one place that contradict each other (`tool X` beside `no-tool X` or a
/// bare `no-tool`, `contains` beside `not-contains` of the same text) fail whatever the
/// agent does: `check` warns at the later one and points at the other; checks that only
/// look alike (other turns, other branches, `count=0`, templates) are not warned of.
#[tokio::test]
async fn contradictory_checks_at_one_place_are_warned() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("s.kdl");
    std::fs::write(
        &suite,
        r#"agent "a" protocol="connexity" builtin="booking"
scenario "contradictions" {
    user "hi"
    expect tool "search" q="a"
    expect no-tool "search"
    user "again"
    expect reply contains="ok" not-contains="ok"
    user "third"
    expect tools-in-order "a" "b"
    expect no-tool
    criteria {
        reply contains="zz"
        reply not-contains="zz"
    }
}
scenario "compatible" {
    user-context { word "ok" }
    user "hi"
    expect tool "search"
    user "again"
    expect no-tool "search"
    expect tool "lookup"
    expect reply contains="Ok" not-contains="ok!"
    branch "one" {
        user "yes"
        expect tool "book"
    }
    branch "two" {
        user "no"
        expect no-tool "book"
    }
    criteria {
        tool "lookup" count=0
        no-tool "lookup"
        reply contains="{{ user_context.word }}"
        reply not-contains="{{ user_context.word }}"
    }
}
"#,
    )
    .unwrap();
    let o = check(&suite).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = crate::flat(&stderr(&o));
    assert_eq!(said.matches("trellis::never_passes").count(), 4, "{said}");
    for (line, text) in [
        (
            5,
            "`no-tool \"search\"` can never pass here: `tool \"search\" q=\"a\"` needs a call to `search` that `no-tool \"search\"` forbids",
        ),
        (7, "the reply must contain \"ok\" and must not contain it"),
        (
            10,
            "`no-tool` can never pass here: `tools-in-order \"a\" \"b\"` needs a call to `a`",
        ),
        (13, "`reply not-contains=\"zz\"` can never pass here"),
    ] {
        assert!(
            said.contains(&format!("s.kdl:{line}:")),
            "line {line}: {said}"
        );
        assert!(said.contains(text), "{text}: {said}");
    }
    // The other check of each pair is pointed at.
    assert!(said.contains("s.kdl:4:12"), "{said}");
    assert!(said.contains("contradicted by this check"), "{said}");
    for line in 17..=42 {
        assert!(
            !said.contains(&format!("s.kdl:{line}:")),
            "line {line}: {said}"
        );
    }
}

/// Warnings come in the order they are written, whatever check found them.
#[tokio::test]
async fn warnings_are_said_in_the_order_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.kdl"),
        "agent \"c\" protocol=\"connexity\" builtin=\"booking\"\n\
         tool \"refund\" {\n    mock returns=\"ok\"\n}\n\
         scenario \"a\" {\n    user \"hi {{ env.TRELLIS_TEST_NEVER_SET }}\"\n    \
         expect no-tool \"refnd\"\n}\n\
         scenario \"b\" {\n    user \"hi\"\n}\n",
    )
    .unwrap();
    let o = trellis()
        .arg("check")
        .arg(dir.path().join("s.kdl"))
        .env_remove("TRELLIS_TEST_NEVER_SET")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    let at = |needle: &str| {
        err.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {err}"))
    };
    assert!(
        at("s.kdl:6:") < at("s.kdl:7:") && at("s.kdl:7:") < at("s.kdl:9:"),
        "{err}"
    );
    // The summary line counts them: valid, not silent.
    assert!(
        stdout(&o).contains(
            "ok: 1 file, 1 suite, 2 scenarios, 2 trajectories, 1 agent; 3 warnings above"
        ),
        "{}",
        stdout(&o)
    );
}
