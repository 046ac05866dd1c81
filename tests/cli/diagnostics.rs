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

    let o = trellis()
        .arg("check")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
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
}
