//! Shell completion: `trellis completions SHELL` prints a script that registers `trellis`
//! with the shell, and the script asks `trellis` itself for the candidates each time the
//! user presses Tab (clap_complete's dynamic completion, [`setup`] in `main`). The
//! candidates come from the clap definition, so new commands and flags complete without a
//! new script, plus what clap cannot know: the runs in the runs directory, for every
//! argument that takes a run (by id, name or `pinned`) or a run's directory.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::CompleteEnv;
use clap_complete::engine::{CompletionCandidate, PathCompleter, ValueCompleter};
use clap_complete::env::Shells;
use trellis_reports::history::{self, RunEntry};

use super::console::{self, errln};
use super::{Cli, EXIT_FAILED, EXIT_OK};

/// The variable the scripts set when they call `trellis` for candidates. Not clap's
/// default `COMPLETE`: a variable of that common name set for something else would turn
/// every `trellis` command into a completion request.
const VAR: &str = "TRELLIS_COMPLETE";

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
    Powershell,
    Elvish,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: Shell,
}

/// Answers a completion request of a script (the program was started with
/// `TRELLIS_COMPLETE` set) and exits; returns at once otherwise. Runs before anything is
/// printed.
pub fn setup() {
    CompleteEnv::with_factory(Cli::command).var(VAR).complete();
}

/// `trellis completions SHELL`: the script that registers completion for `trellis`.
pub fn completions(args: &CompletionsArgs) -> u8 {
    let name = match args.shell {
        Shell::Bash => "bash",
        Shell::Zsh => "zsh",
        Shell::Fish => "fish",
        Shell::Powershell => "powershell",
        Shell::Elvish => "elvish",
    };
    let shells = Shells::builtins();
    let Some(shell) = shells.completer(name) else {
        errln!("error: no completion script for {name}");
        return EXIT_FAILED;
    };
    let mut script = Vec::new();
    if let Err(e) = shell.write_registration(VAR, "trellis", "trellis", &completer(), &mut script) {
        errln!("error: cannot write the {name} script: {e}");
        return EXIT_FAILED;
    }
    console::out_text(&String::from_utf8_lossy(&script));
    EXIT_OK
}

/// How the script calls this program: by name when it was found on `PATH`, else by its
/// absolute path (as clap_complete does for `TRELLIS_COMPLETE=bash trellis`), so a script
/// written by `./target/debug/trellis` keeps working from any directory.
fn completer() -> String {
    let argv0 = std::env::args_os()
        .next()
        .unwrap_or_else(|| OsString::from("trellis"));
    let path = PathBuf::from(&argv0);
    if path.components().count() > 1
        && path.is_relative()
        && let Ok(dir) = std::env::current_dir()
    {
        return dir.join(path).to_string_lossy().into_owned();
    }
    path.to_string_lossy().into_owned()
}

/// The runs directory the command being completed names: its `--dir` (`runs`, `compare`,
/// `calibrate`), else the parent of its `--out` (`run --baseline` looks next to the new
/// run), else `runs`. Read from the words the script passed, since clap_complete gives a
/// candidate function nothing but the word being completed.
fn runs_dir() -> PathBuf {
    let words: Vec<OsString> = std::env::args_os()
        .skip_while(|a| a != "--")
        .skip(1)
        .collect();
    let value = |flag: &str| -> Option<PathBuf> {
        let with_eq = format!("{flag}=");
        words.iter().enumerate().rev().find_map(|(i, word)| {
            let word = word.to_str()?;
            if word == flag {
                words.get(i + 1).map(PathBuf::from)
            } else {
                word.strip_prefix(&with_eq).map(PathBuf::from)
            }
        })
    };
    if let Some(dir) = value("--dir").filter(|d| !d.as_os_str().is_empty()) {
        return dir;
    }
    if let Some(out) = value("--out") {
        return out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    }
    PathBuf::from("runs")
}

/// The runs of [`runs_dir`], most recent first; none when it cannot be read (a completion
/// prints no errors).
fn listed_runs() -> Vec<RunEntry> {
    let mut runs = history::list_runs(&runs_dir()).unwrap_or_default();
    runs.reverse();
    runs
}

/// What a run is, in a candidate's help: its name, when it started, its pass rate.
fn describe(run: &RunEntry) -> String {
    let mut parts = Vec::new();
    if let Some(name) = &run.name {
        parts.push(name.clone());
    }
    if let Some(started) = &run.started_at {
        parts.push(started.clone());
    }
    if let Some(rate) = run.pass_rate() {
        parts.push(format!("{:.0}% passed", rate * 100.0));
    }
    if run.baseline {
        parts.push("pinned".into());
    }
    if !run.finished {
        parts.push("unfinished".into());
    }
    parts.join(", ")
}

/// Candidates for an argument that takes a run: every run id and name of the runs
/// directory (most recent first), and `pinned` when a run is pinned.
pub fn runs() -> Vec<CompletionCandidate> {
    let runs = listed_runs();
    let mut out: Vec<(String, String)> = Vec::new();
    if let Some(pinned) = runs.iter().find(|r| r.baseline) {
        out.push((
            "pinned".into(),
            format!("the pinned baseline, {}", pinned.run_id),
        ));
    }
    out.extend(runs.iter().map(|run| (run.run_id.clone(), describe(run))));
    out.extend(runs.iter().filter_map(|run| {
        let name = run.name.clone()?;
        Some((name, format!("run {}", run.run_id)))
    }));
    out.into_iter()
        .enumerate()
        .map(|(i, (value, help))| {
            CompletionCandidate::new(value)
                .help(Some(help.into()))
                .display_order(Some(i))
        })
        .collect()
}

/// Candidates for an argument that takes a run's directory: the run directories of the
/// runs directory that start with what is typed (most recent first), then any directory.
pub fn run_dirs(current: &OsStr) -> Vec<CompletionCandidate> {
    let typed = current.to_string_lossy();
    let mut out: Vec<CompletionCandidate> = listed_runs()
        .iter()
        .filter_map(|run| {
            let dir = run.dir.to_string_lossy().into_owned();
            dir.starts_with(&*typed)
                .then(|| CompletionCandidate::new(dir).help(Some(describe(run).into())))
        })
        .collect();
    for candidate in PathCompleter::dir().complete(current) {
        let value = candidate.get_value();
        // `runs/ID/` is `runs/ID`.
        if !out
            .iter()
            .any(|c| Path::new(c.get_value()) == Path::new(value))
        {
            out.push(candidate);
        }
    }
    out
}
