//! What `trellis run` records about itself in `run.json` before the engine starts: the
//! suite fingerprint, the git commit the suites come from, the agents' endpoints (without
//! secrets), the tag selection, the user's `--label`s, and the suite files and selection the
//! plan came from (`source`, which `trellis variance RUN` plans the run again from).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use trellis_dsl::{Endpoint, HistorySource, Project, SocketAddress};
use trellis_engine::plan::{Plan, Selection};
use trellis_reports::history::{
    AgentEndpoint, GitState, RunMeta, RunSource, SCHEMA_VERSION, SourceFileMeta, redact_url,
};

/// `--label key=value`: a key of letters, digits, `_`, `-` and `.`, any value.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not key=value"))?;
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(format!(
            "label key `{key}` must be letters, digits, `_`, `-` or `.`"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// `run.json` of a run of `plan` as it starts: its `git` is added at its end, from
/// [`GitProbe`].
pub fn build(
    run_id: &str,
    project: &Project,
    plan: &Plan,
    selection: &Selection,
    labels: &[(String, String)],
) -> RunMeta {
    let labels: BTreeMap<String, String> = labels.iter().cloned().collect();
    RunMeta {
        schema_version: SCHEMA_VERSION,
        run_id: run_id.to_owned(),
        trellis_version: env!("CARGO_PKG_VERSION").to_owned(),
        suite_fingerprint: fingerprint(project),
        git: None,
        endpoints: plan
            .agents
            .iter()
            .map(|a| AgentEndpoint {
                agent: a.id.to_string(),
                protocol: a.protocol.as_str().to_owned(),
                endpoint: endpoint(&a.endpoint),
            })
            .collect(),
        tags: selection.tags.clone(),
        labels,
        name: None,
        baseline: false,
        watch_rerun: None,
        watch_latest: false,
        compared_with: None,
        shard: None,
        merged: None,
        variance_condition: None,
        rejudged_from: None,
        source: Some(source(project, selection)),
    }
}

/// The files `project` was loaded from (absolute) with the hash of each one's text, and the
/// selection.
pub fn source(project: &Project, selection: &Selection) -> RunSource {
    RunSource {
        files: project
            .files
            .iter()
            .map(|f| SourceFileMeta {
                path: absolute(&f.path).display().to_string(),
                blake3: text_hash(&f.text),
            })
            .collect(),
        filters: selection.filters.clone(),
        include_inactive: selection.include_inactive,
    }
}

/// `path` made absolute without resolving links: the path the user's suites are known by
/// (canonicalising would name a symlinked checkout by its target). Unchanged if the working
/// directory cannot be read.
pub fn absolute(path: &Path) -> std::path::PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// BLAKE3 (hex) of one suite file's text, as `run.json`'s `source` records it.
pub fn text_hash(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// BLAKE3 of the loaded suite files' text, sorted so the order files were found in does
/// not matter, each prefixed by its length so no two sets of files hash alike; then of the
/// files the suites read their cases from (datasets, recorded histories), by path: an
/// edited CSV row runs other cases, so the suites are not the same.
pub fn fingerprint(project: &Project) -> String {
    let mut texts: Vec<&str> = project.files.iter().map(|f| &*f.text).collect();
    texts.sort_unstable();
    let mut hasher = blake3::Hasher::new();
    for text in texts {
        hasher.update(&(text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    let mut read: Vec<&Path> = project
        .datasets
        .iter()
        .map(|d| d.resolved.as_path())
        .chain(project.scenarios().filter_map(|(_, sc)| {
            match sc.history.as_deref().map(|h| &h.source) {
                Some(HistorySource::File { resolved, .. }) => Some(resolved.as_path()),
                _ => None,
            }
        }))
        .collect();
    read.sort_unstable();
    read.dedup();
    for path in read {
        hash_file(&mut hasher, path);
    }
    hasher.finalize().to_hex().to_string()
}

/// Adds `path`'s length and bytes to `hasher`, as reading the file whole and hashing both
/// does, but read in pieces: a dataset of 22 MB read whole was 16 ms of the run's start
/// (copied into new memory, a page fault every 4 KB) for 6 ms of hashing. A file whose
/// length changes while it is read is read whole again, which gives the bytes the length
/// belongs to; the run has just read these files, and one that is gone since hashes as an
/// empty one.
fn hash_file(hasher: &mut blake3::Hasher, path: &Path) {
    let in_pieces = || -> std::io::Result<Option<blake3::Hasher>> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        let mut hashed = hasher.clone();
        hashed.update(&len.to_le_bytes());
        // One byte past the length shows a file that grew.
        let mut reader = std::io::Read::take(&file, len.saturating_add(1));
        hashed.update_reader(&mut reader)?;
        let read = len.saturating_add(1) - reader.limit();
        Ok((read == len).then_some(hashed))
    };
    match in_pieces() {
        Ok(Some(hashed)) => *hasher = hashed,
        _ => {
            let bytes = std::fs::read(path).unwrap_or_default();
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
        }
    }
}

/// The commit and dirty flag of the repository holding the suites, asked of `git` while the
/// run goes on. A `git` command costs a process start and `status` reads every tracked
/// file's metadata: `rev-parse` and `status` were 3–5 ms together on this machine, which
/// `trellis run` paid before its first agent call, a third of a one-trajectory run. One
/// `status` now says both, and `run.json` is written without them and completed at the end
/// of the run ([`GitProbe::finish`]); outside a repository no process is started at all.
pub struct GitProbe {
    answer: Option<std::thread::JoinHandle<Option<GitState>>>,
}

impl GitProbe {
    /// Starts asking about the repository holding `path`, a suite file or directory as given
    /// on the command line; `None` outside a repository.
    pub fn start(path: &Path) -> Option<GitProbe> {
        let dir = if path.is_dir() {
            path
        } else {
            path.parent().unwrap_or(Path::new("."))
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if !in_repository(dir) {
            return None;
        }
        // One command says both: `--branch` heads the status with the commit
        // (`# branch.oid SHA`, `(initial)` before the first), and any other line is a tracked
        // file that differs from it. Read on a thread of its own, so that it never waits on a
        // full pipe. It runs beside the user's own git work: it must not take the index's lock
        // to refresh it (a `git commit` meanwhile would fail on `index.lock`).
        let status = Command::new("git")
            .arg("--no-optional-locks")
            .arg("-C")
            .arg(dir)
            .args([
                "status",
                "--porcelain=v2",
                "--branch",
                "--untracked-files=no",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        let read = move || {
            let output = status?
                .wait_with_output()
                .ok()
                .filter(|o| o.status.success())?;
            parse_status(&String::from_utf8_lossy(&output.stdout))
        };
        let answer = std::thread::Builder::new()
            .name("trellis-git".into())
            .spawn(read)
            .ok();
        Some(GitProbe { answer })
    }

    /// What `git` said: the commit, and whether tracked files differ from it.
    pub fn finish(mut self) -> Option<GitState> {
        self.answer.take()?.join().ok().flatten()
    }
}

/// The commit and dirty flag in `git status --porcelain=v2 --branch`'s output; `None` before
/// the first commit.
fn parse_status(text: &str) -> Option<GitState> {
    let mut commit = None;
    let mut dirty = false;
    for line in text.lines() {
        match line.strip_prefix("# branch.oid ") {
            Some(oid) => commit = Some(oid.trim()),
            None if line.starts_with("# ") || line.is_empty() => {}
            None => dirty = true,
        }
    }
    let commit = commit.filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_hexdigit()))?;
    Some(GitState {
        commit: commit.to_owned(),
        dirty,
    })
}

impl Drop for GitProbe {
    /// A probe not asked for its answer (the run stopped before its end) still waits for its
    /// processes: none is left behind.
    fn drop(&mut self) {
        if let Some(answer) = self.answer.take() {
            let _ = answer.join();
        }
    }
}

/// Whether `git` could find a repository for `dir`: a `.git` (directory, or the file a
/// worktree or submodule has) in it or a parent, or `GIT_DIR` set. Only a "no" is relied
/// on: it spares starting `git` just to hear it say so.
fn in_repository(dir: &Path) -> bool {
    if std::env::var_os("GIT_DIR").is_some() {
        return true;
    }
    // The physical path, as `git` walks it (after `-C`, from `getcwd`).
    let Ok(dir) = dir.canonicalize() else {
        return true;
    };
    dir.ancestors().any(|d| d.join(".git").exists())
}

fn endpoint(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Url(url) => redact_url(&url.source),
        Endpoint::Builtin(name) => format!("builtin:{}", name.value),
        // Arguments may carry tokens; the program says what ran.
        Endpoint::Command(command) => format!(
            "command:{}",
            command.split_whitespace().next().unwrap_or_default()
        ),
        Endpoint::Socket(SocketAddress::Tcp { host, port }) => format!("socket:tcp:{host}:{port}"),
        Endpoint::Socket(SocketAddress::Unix(path)) => {
            format!("socket:unix:{}", path.display())
        }
        // The provider node says where it is; its id is what the suite names.
        Endpoint::Provider(name) => format!("provider:{}", name.value),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_label;

    #[test]
    fn git_status_gives_the_commit_and_whether_tracked_files_changed() {
        let head = "# branch.oid 5b0109892db2edfae9a7f1f2770ae8b73a70f861\n# branch.head main\n";
        let clean = super::parse_status(head).unwrap();
        assert_eq!(clean.commit, "5b0109892db2edfae9a7f1f2770ae8b73a70f861");
        assert!(!clean.dirty);
        let changed = format!("{head}1 .M N... 100644 100644 100644 587b 587b a.kdl\n");
        assert!(super::parse_status(&changed).unwrap().dirty);
        // Before the first commit there is none to record.
        assert!(super::parse_status("# branch.oid (initial)\n# branch.head main\n").is_none());
        assert!(super::parse_status("").is_none());
    }

    /// A file hashed in pieces gives the digest it gave read whole (its length, then its
    /// bytes), from empty to past the pieces' size, and a missing file hashes as an empty
    /// one.
    #[test]
    fn a_file_hashed_in_pieces_gives_the_digest_of_the_file_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let whole = |path: &std::path::Path| {
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"suites");
            let bytes = std::fs::read(path).unwrap_or_default();
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(&bytes);
            hasher.finalize()
        };
        let in_pieces = |path: &std::path::Path| {
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"suites");
            super::hash_file(&mut hasher, path);
            hasher.finalize()
        };
        for len in [
            0usize,
            1,
            1023,
            16 * 1024,
            64 * 1024 - 1,
            64 * 1024 + 1,
            1 << 20,
        ] {
            let path = dir.path().join(format!("rows-{len}.csv"));
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(in_pieces(&path), whole(&path), "{len} bytes");
        }
        let gone = dir.path().join("gone.csv");
        assert_eq!(in_pieces(&gone), whole(&gone));
        let other = dir.path().join("rows-1.csv");
        assert_ne!(in_pieces(&other), in_pieces(&gone));
    }

    #[test]
    fn labels_are_key_value_with_a_plain_key() {
        assert_eq!(
            parse_label("model=gpt-4o=mini").unwrap(),
            ("model".into(), "gpt-4o=mini".into())
        );
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("=x").is_err());
        assert!(parse_label("a b=x").is_err());
    }
}
