//! `trellis completions`: the bash script driven in a real `bash` (the completion function
//! called as bash calls it on Tab), completing a run id and name made by a real `trellis
//! run`; the other shells' scripts and the candidate protocol they use.

use super::*;

const SUITE: &str = r#"agent "demo" protocol="connexity" builtin="booking"
scenario "hi" {
    user "Hi, I'd like to book a duct cleaning."
    expect reply contains="postal code"
}
"#;

/// A directory holding `suite.kdl` and one real run of it, named `nightly`; its run id.
async fn one_run() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("suite.kdl"), SUITE).unwrap();
    let o = trellis()
        .current_dir(dir.path())
        .args(["run", "suite.kdl", "--quiet"])
        .output()
        .await
        .unwrap();
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let ids: Vec<String> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].clone();
    let o = trellis()
        .current_dir(dir.path())
        .args(["runs", "name", &id, "nightly"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    (dir, id)
}

/// What the bash completion of `trellis completions bash` offers for each command line
/// (the last word is the one being completed), run in `dir`, one line of candidates per
/// command line, separated by `|`.
async fn bash_complete(dir: &Path, lines: &[&[&str]]) -> Vec<Vec<String>> {
    let o = trellis()
        .args(["completions", "bash"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::write(dir.join("trellis.bash"), &o.stdout).unwrap();
    let mut script = String::from(
        r#"source ./trellis.bash
complete_words() {
    COMP_WORDS=("$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="$*"
    COMP_POINT=${#COMP_LINE}
    COMP_TYPE=9
    COMPREPLY=()
    _clap_complete_trellis trellis "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    local IFS='|'
    echo "${COMPREPLY[*]}"
}
"#,
    );
    for words in lines {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        script.push_str(&format!("complete_words trellis {}\n", quoted.join(" ")));
    }
    // A real bash (a missing one fails the test), without the user's start-up files.
    let o = tokio::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &script])
        .current_dir(dir)
        .env_remove("TRELLIS_COMPLETE")
        .output()
        .await
        .expect("bash runs");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let replies: Vec<Vec<String>> = out
        .lines()
        .map(|l| {
            l.split('|')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .collect();
    assert_eq!(replies.len(), lines.len(), "{out}\n{}", stderr(&o));
    replies
}

#[tokio::test]
async fn bash_completes_commands_run_ids_names_and_run_directories() {
    let (dir, id) = one_run().await;
    let prefix = &id[..6];
    let run_dir = format!("runs/{id}");
    let replies = bash_complete(
        dir.path(),
        &[
            &["fm"],
            &["fmt", "--ch"],
            &["compare", ""],
            &["compare", prefix],
            &["compare", "nightly", "night"],
            &["runs", "pin", ""],
            &["calibrate", ""],
            &["run", "suite.kdl", "--baseline", ""],
            &["report", "runs/"],
            &["rejudge", "ru"],
            &["compare", "--dir", "elsewhere", ""],
        ],
    )
    .await;
    assert_eq!(replies[0], ["fmt"]);
    assert_eq!(replies[1], ["--check"]);
    assert!(replies[2].contains(&id), "{:?}", replies[2]);
    assert!(
        replies[2].contains(&"nightly".to_string()),
        "{:?}",
        replies[2]
    );
    assert_eq!(replies[3], std::slice::from_ref(&id));
    assert_eq!(replies[4], ["nightly"]);
    for reply in &replies[5..8] {
        assert!(reply.contains(&id), "{reply:?}");
        assert!(reply.contains(&"nightly".to_string()), "{reply:?}");
    }
    assert_eq!(replies[8], std::slice::from_ref(&run_dir));
    assert!(replies[9].contains(&run_dir), "{:?}", replies[9]);
    // The runs of `--dir`: there are none there.
    assert!(!replies[10].contains(&id), "{:?}", replies[10]);

    // Pinned, the run is also `pinned`.
    let o = trellis()
        .current_dir(dir.path())
        .args(["runs", "pin", "nightly"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let replies = bash_complete(dir.path(), &[&["compare", "pin"]]).await;
    assert_eq!(replies[0], ["pinned"]);
}

#[tokio::test]
async fn every_shell_gets_a_script_calling_back_for_candidates() {
    let (dir, id) = one_run().await;
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let o = trellis()
            .args(["completions", shell])
            .output()
            .await
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        assert!(script.contains("TRELLIS_COMPLETE"), "{shell}: {script}");
        assert!(
            script.contains(env!("CARGO_BIN_EXE_trellis")),
            "{shell} calls this executable back: {script}"
        );
    }
    // What the fish script asks and gets: candidates with their help.
    let o = trellis()
        .current_dir(dir.path())
        .env("TRELLIS_COMPLETE", "fish")
        .args(["--", "trellis", "compare", ""])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!("{id}\tnightly, ")), "{out}");
    assert!(out.contains(&format!("nightly\trun {id}")), "{out}");

    // An unknown shell is a usage error; a variable named like clap's default does not
    // turn a command into a completion request.
    let o = trellis()
        .args(["completions", "tcsh"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = trellis()
        .env("COMPLETE", "bash")
        .arg("--version")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("trellis "), "{}", stdout(&o));
}
