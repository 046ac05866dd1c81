//! `trellis fmt`: suites rewritten in place (atomically, comments and values kept, line
//! endings and permissions too), `--check` for CI, and nothing written when a file does not
//! parse.

use super::*;

/// A valid suite laid out badly, with a comment of every kind.
const MESSY: &str = r##"// The suite's head comment.
include "../shared/agents.kdl"


/* A block comment
   of two lines. */
scenario   "greets"  {
  agent "demo"; tags "smoke"   "fmt"
  user-context {   zone "V5K" }
      user "Hi"           // aligned
      expect reply contains = "help"
  /- user "not sent"
  branch "price" /-{ ignored } {
user "How much?"
    expect reply matches=#"\$\d+"#
  }  // after the branch
  criteria { no-error; }
}
/-scenario "off" { user "x" }
"##;

const FORMATTED: &str = r##"// The suite's head comment.
include "../shared/agents.kdl"

/* A block comment
   of two lines. */
scenario "greets" {
    agent "demo"
    tags "smoke" "fmt"
    user-context { zone "V5K" }
    user "Hi"           // aligned
    expect reply contains="help"
    /-user "not sent"
    branch "price" /-{ ignored } {
        user "How much?"
        expect reply matches=#"\$\d+"#
    }  // after the branch
    criteria { no-error }
}
/-scenario "off" { user "x" }
"##;

const AGENTS: &str = "agent \"demo\"   protocol=\"connexity\" builtin=\"booking\"\n";

async fn run(dir: &Path, args: &[&str]) -> Output {
    trellis()
        .current_dir(dir)
        .args(args)
        .output()
        .await
        .unwrap()
}

fn suite_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // The included file is outside the directory walked: found through the `include`.
    std::fs::create_dir_all(dir.path().join("suites")).unwrap();
    std::fs::create_dir_all(dir.path().join("shared")).unwrap();
    std::fs::write(dir.path().join("suites/greets.kdl"), MESSY).unwrap();
    std::fs::write(dir.path().join("shared/agents.kdl"), AGENTS).unwrap();
    dir
}

#[tokio::test]
async fn the_example_suites_are_formatted() {
    let o = trellis()
        .args(["fmt", "--check", "suites/"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("already formatted"), "{}", stderr(&o));
    let o = trellis()
        .args(["fmt", "--check", "examples/"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

#[tokio::test]
async fn fmt_lays_a_suite_out_keeping_comments_and_meaning() {
    let dir = suite_dir();
    let suite = dir.path().join("suites/greets.kdl");
    let list_before = run(dir.path(), &["list"]).await;
    assert_eq!(
        list_before.status.code(),
        Some(0),
        "{}",
        stderr(&list_before)
    );

    // --check: exit 1, the file and a diff, nothing written.
    let o = run(dir.path(), &["fmt", "--check"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("would reformat suites/greets.kdl"), "{out}");
    assert!(out.contains("-  agent \"demo\"; tags"), "{out}");
    assert!(out.contains("+    agent \"demo\""), "{out}");
    assert!(out.contains("would reformat shared/agents.kdl"), "{out}");
    assert!(
        stderr(&o).contains("2 of 2 files would be reformatted"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&suite).unwrap(), MESSY);

    // Written: the names on stdout, every comment kept, the included file formatted too.
    let o = run(dir.path(), &["fmt"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "suites/greets.kdl\nshared/agents.kdl\n",
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&suite).unwrap(), FORMATTED);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("shared/agents.kdl")).unwrap(),
        "agent \"demo\" protocol=\"connexity\" builtin=\"booking\"\n"
    );

    // Same scenarios and trajectories.
    let list_after = run(dir.path(), &["list"]).await;
    assert_eq!(stdout(&list_after), stdout(&list_before));
    let o = run(dir.path(), &["check"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A second run changes nothing.
    let o = run(dir.path(), &["fmt"]).await;
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "");
    assert!(
        stderr(&o).contains("2 files already formatted"),
        "{}",
        stderr(&o)
    );
    let o = run(dir.path(), &["fmt", "--check"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(std::fs::read_to_string(&suite).unwrap(), FORMATTED);
}

#[cfg(unix)]
#[tokio::test]
async fn fmt_writes_atomically_keeping_line_endings_permissions_and_links() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crlf.kdl");
    std::fs::write(
        &file,
        "scenario \"s\" {\r\n  user \"hi\"; user \"bye\"\r\n}\r\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("crlf.kdl", dir.path().join("link.kdl")).unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();

    let o = run(dir.path(), &["fmt", "link.kdl"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "scenario \"s\" {\r\n    user \"hi\"\r\n    user \"bye\"\r\n}\r\n"
    );
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    // Renamed over the file, not written into it.
    assert_ne!(meta.ino(), inode);
    assert!(
        std::fs::symlink_metadata(dir.path().join("link.kdl"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["crlf.kdl", "link.kdl"], "no temporary file left");
}

#[tokio::test]
async fn fmt_refuses_a_file_that_does_not_parse_and_writes_nothing() {
    let dir = suite_dir();
    let broken = "scenario \"b\" {\n    user \"unclosed\n}\n";
    std::fs::write(dir.path().join("suites/broken.kdl"), broken).unwrap();

    let check = run(dir.path(), &["check"]).await;
    assert_eq!(check.status.code(), Some(2));
    for args in [&["fmt"][..], &["fmt", "--check"]] {
        let o = run(dir.path(), args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        // The diagnostic `check` prints for it: file, line and column, label, hint.
        assert!(err.contains("suites/broken.kdl:2:10"), "{err}");
        assert!(err.contains("trellis::kdl_syntax"), "{err}");
        assert!(err.contains("help:"), "{err}");
        let syntax = |text: &str| -> String {
            text.lines()
                .skip_while(|l| !l.contains("trellis::kdl_syntax"))
                .take_while(|l| !l.starts_with("error:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(syntax(&stderr(&check)).starts_with(&syntax(&err)), "{err}");
        assert_eq!(stdout(&o), "");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("suites/greets.kdl")).unwrap(),
        MESSY,
        "nothing is written while a file does not parse"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("suites/broken.kdl")).unwrap(),
        broken
    );

    let o = run(dir.path(), &["fmt", "missing.kdl"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cannot read `missing.kdl`"),
        "{}",
        stderr(&o)
    );
}

/// A file with another hard link is formatted in place: both names show the new text (a
/// rename over it left the other link with the old one).
#[tokio::test]
async fn a_hard_linked_file_is_formatted_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.kdl");
    let two = dir.path().join("two.kdl");
    std::fs::write(
        &one,
        "agent \"a\" protocol=\"connexity\"   builtin=\"booking\"\n",
    )
    .unwrap();
    std::fs::hard_link(&one, &two).unwrap();
    let o = trellis().arg("fmt").arg(&one).output().await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let formatted = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n";
    assert_eq!(std::fs::read_to_string(&one).unwrap(), formatted);
    assert_eq!(std::fs::read_to_string(&two).unwrap(), formatted);
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(std::fs::metadata(&one).unwrap().nlink(), 2);
}
