//! Runs as a history: the metadata each run keeps in `run.json`, and finding, listing,
//! naming and pinning runs under a runs directory.
//!
//! `run.json` is written by `trellis run` before the engine starts, so a run that crashes
//! still says what it ran (suite fingerprint, git commit, endpoints, labels). Its `name` and
//! `baseline` fields are the only ones that change after the run (`trellis runs name`,
//! `trellis runs pin`); every write goes through a temporary file and a rename. The
//! immutable part is copied into `runs.parquet` when the tables are written, so a glob over
//! `runs/*/runs.parquet` carries it. The layout is documented in `docs/results.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use polars_error::{PolarsError, PolarsResult};
use serde::{Deserialize, Serialize};

use crate::JOURNAL_FILE;
use crate::error::ReportError;

/// Version of the result tables' layout, in every table's `schema_version` column and in
/// `run.json`. Raised whenever a column changes meaning, is renamed or removed.
pub const SCHEMA_VERSION: u32 = 2;
/// The run metadata file in a run directory.
pub const RUN_META_FILE: &str = "run.json";

/// Where the suites came from in git, when they are in a repository.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitState {
    /// `git rev-parse HEAD`.
    pub commit: String,
    /// Tracked files differ from the commit (`git status --porcelain --untracked-files=no`).
    pub dirty: bool,
}

/// One agent as the run reached it, without secrets: header values are never recorded and
/// URLs lose their user, password, query and fragment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentEndpoint {
    pub agent: String,
    pub protocol: String,
    /// `https://host/path`, `builtin:NAME`, `command:PROGRAM` (arguments left out: they may
    /// carry tokens) or `socket:ADDRESS`.
    pub endpoint: String,
}

/// `run.json`: what a run ran against, and how people refer to it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    #[serde(default)]
    pub schema_version: u32,
    pub run_id: String,
    #[serde(default)]
    pub trellis_version: String,
    /// A stable hash of the loaded suite files (names and text), so runs of the same suites
    /// can be told apart from runs of edited ones.
    #[serde(default)]
    pub suite_fingerprint: String,
    #[serde(default)]
    pub git: Option<GitState>,
    #[serde(default)]
    pub endpoints: Vec<AgentEndpoint>,
    /// The run's `--tag` selection.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `--label key=value`, sorted by key.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Set by `trellis runs name`; unique within a runs directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Set by `trellis runs pin`: the baseline `compare` and `run --baseline` use by default.
    /// At most one run of a runs directory has it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
    /// Set by `trellis watch` on each rerun's directory: the number of the rerun. Such a
    /// directory records only what reran, so it is not a whole run: history listings,
    /// comparisons and trends leave it out ([`is_watch_rerun`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_rerun: Option<u64>,
    /// Set by `trellis watch` on its `latest/` mirror: the whole current state, under the
    /// last rerun's run id, so it is neither a run nor a rerun of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watch_latest: bool,
    /// Set by `trellis run --shard I/N`: the directory holds one shard of a run, not a
    /// whole run, so history listings, comparisons, trends and the costs shards are
    /// balanced by leave it out ([`is_part_of_run`]) until `trellis merge` combines it with
    /// the other shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardMeta>,
    /// Set by `trellis merge`: the shard runs this run was combined from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<MergeMeta>,
    /// Set by `trellis variance RUN` on the runs of its conditions (`RUN/variance/agent`,
    /// `…/free`): the condition. Repetitions of RUN's scenarios made to measure variance,
    /// not runs of their own: `runs.parquet` says `variance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variance_condition: Option<String>,
    /// Set by `trellis rejudge`: the run whose transcripts this one re-scored. Not another
    /// point of a trend (the same transcripts, judged again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejudged_from: Option<String>,
    /// Set by `trellis run --baseline`: the run (its name, or id) this one is compared with
    /// in `compare.html`, so the run's own page can link the comparison.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compared_with: Option<String>,
    /// What the run was planned from, so it can be planned again without its paths
    /// (`trellis variance RUN`). Absent from runs recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RunSource>,
}

/// `run.json`'s `source`: the suite files a run loaded and the selection it ran.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSource {
    /// Every suite file loaded (included ones too), in load order.
    pub files: Vec<SourceFileMeta>,
    /// `--filter` globs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<String>,
    /// `--include-inactive`. (The `--tag` selection is the run's `tags`.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_inactive: bool,
}

/// One loaded suite file: where it was and what it said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFileMeta {
    /// Absolute.
    pub path: String,
    /// BLAKE3 (hex) of the text the run loaded, to tell an edited file from the one run.
    pub blake3: String,
}

/// `run.json`'s `shard`: which shard of how many (the whole split is in the shard's
/// `shard.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    /// From 1 to `count`.
    pub index: u32,
    pub count: u32,
    /// The split's digest (`shard.json`'s `digest`): equal in every shard of one run.
    pub digest: String,
}

/// `run.json`'s `merged`: what `trellis merge` combined.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeMeta {
    /// The shard count of the split.
    pub shards: u32,
    /// The run id of each shard merged, in shard order.
    pub runs: Vec<String>,
    /// `--allow-partial` merged shards that did not cover the whole plan: the run is
    /// recorded as unfinished, and `missing` trajectory runs of the plan are not in it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// Planned trajectory runs (trajectory × agent × repetition) no shard recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missing: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RunMeta {
    /// Reads `dir/run.json`; `Ok(None)` when the run has none (runs from before it existed).
    pub fn read(dir: &Path) -> Result<Option<RunMeta>, HistoryError> {
        let path = dir.join(RUN_META_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HistoryError::Io { path, source }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| HistoryError::BadMeta { path, source })
    }

    /// Writes `dir/run.json` through a temporary file, replacing an earlier one.
    pub fn write(&self, dir: &Path) -> Result<(), HistoryError> {
        let path = dir.join(RUN_META_FILE);
        let partial = dir.join(format!("{RUN_META_FILE}{}", crate::PARTIAL_SUFFIX));
        let text = serde_json::to_string_pretty(self).map_err(|source| HistoryError::BadMeta {
            path: path.clone(),
            source,
        })?;
        // A write that fails (a full disk) leaves no empty `run.json.partial` behind.
        if let Err(source) = std::fs::write(&partial, text + "\n") {
            let _ = std::fs::remove_file(&partial);
            return Err(HistoryError::Io {
                path: partial.clone(),
                source,
            });
        }
        std::fs::rename(&partial, &path).map_err(|source| {
            let _ = std::fs::remove_file(&partial);
            HistoryError::Io { path, source }
        })
    }

    /// `key=value` for each label, sorted by key (as in `runs.parquet`).
    pub fn label_pairs(&self) -> Vec<String> {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }
}

/// Removes what may carry a secret from an agent URL: user, password, query and fragment.
/// A URL that does not parse (a template) keeps only what comes before `?` or `#`, with
/// anything up to an `@` in its authority dropped.
pub fn redact_url(text: &str) -> String {
    if let Some(url) = parsed_without_secrets(text) {
        return url;
    }
    let base = text.split(['?', '#']).next().unwrap_or_default();
    match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            format!("{scheme}://{host}{path}")
        }
        None => base.to_owned(),
    }
}

/// `text` parsed as an absolute URL with a host, its secrets removed. A template does not
/// parse (or parses with its braces percent-encoded, which would hide what was written).
fn parsed_without_secrets(text: &str) -> Option<String> {
    if text.contains("{{") {
        return None;
    }
    let mut url = ::url::Url::parse(text).ok()?;
    if !url.has_host() {
        return None;
    }
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    Some(url.to_string())
}

/// Why a run could not be found, read or changed.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum HistoryError {
    #[error("cannot read or write {}", path.display())]
    #[diagnostic(code(trellis::history::io))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not valid run metadata", path.display())]
    #[diagnostic(
        code(trellis::history::bad_meta),
        help(
            "it is written by `trellis run`; delete it to drop the run's name, labels and pin \
             (or move the run directory away). Until then, the pinned baseline and id \
             prefixes cannot be told apart from it: name a run by its directory, its whole id \
             or its name"
        )
    )]
    BadMeta {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("no run `{what}` in {}", dir.display())]
    #[diagnostic(
        code(trellis::history::no_such_run),
        help(
            "name a run directory, a run id or a name given with `trellis runs name`; `trellis runs` lists them"
        )
    )]
    NoSuchRun { what: String, dir: PathBuf },

    #[error("{} is a directory, but not a run's: it holds neither run.json nor a journal", dir.display())]
    #[diagnostic(
        code(trellis::history::not_a_run),
        help(
            "name a directory `trellis run --out` wrote, a run id or a name; `trellis runs` lists them"
        )
    )]
    NotARunDir { dir: PathBuf },

    #[error("an empty run name names no run")]
    #[diagnostic(
        code(trellis::history::empty_run),
        help(
            "an unset variable (`--baseline \"$BASELINE\"`) gives an empty one; name a run \
             directory, a run id or a name, or `pinned`"
        )
    )]
    EmptyRunName,

    #[error(
        "`{}` names both run {named} and the run directory {}",
        dir.file_name().unwrap_or_default().display(),
        dir.display()
    )]
    #[diagnostic(
        code(trellis::history::ambiguous),
        help(
            "give the run id, or the directory as a path (`./NAME`, `runs/NAME`) instead; \
             `trellis runs name` moves a name to another run"
        )
    )]
    NameAndDirectory { named: String, dir: PathBuf },

    #[error("`{what}` matches several runs in {}: {}", dir.display(), matches.join(", "))]
    #[diagnostic(code(trellis::history::ambiguous), help("use the full run id"))]
    Ambiguous {
        what: String,
        dir: PathBuf,
        matches: Vec<String>,
    },

    #[error("{}", what)]
    #[diagnostic(code(trellis::history::not_enough_runs))]
    NotEnoughRuns { what: String },

    #[error("run {run} {why}")]
    #[diagnostic(
        code(trellis::history::empty_baseline),
        help(
            "pin a run that covered its plan and checked the agent (`trellis runs` lists them), or pass --force to pin this one anyway"
        )
    )]
    EmptyBaseline { run: String, why: String },

    #[error("no run in {} is pinned as the baseline", dir.display())]
    #[diagnostic(
        code(trellis::history::nothing_pinned),
        help(
            "pin the run to hold the agent to with `trellis runs pin RUN` (`trellis runs` lists them); the pinned run is looked for beside this run's directory (in the parent of `--out`): elsewhere, name it with `--baseline DIR`"
        )
    )]
    NothingPinned { dir: PathBuf },

    #[error("no run is pinned as the baseline (`{word}` names the pinned run)")]
    #[diagnostic(
        code(trellis::history::nothing_pinned),
        help("to name that directory, write it as a path: `{}`", dir.display())
    )]
    NothingPinnedButDirectory { word: &'static str, dir: PathBuf },

    #[error("{} is a rerun of `trellis watch`, not a whole run", dir.display())]
    #[diagnostic(
        code(trellis::history::watch_rerun),
        help(
            "a rerun's directory holds only what reran; compare whole runs made by `trellis run` (`trellis runs` lists them)"
        )
    )]
    WatchRerun { dir: PathBuf },

    #[error("{} holds one shard of a run, not a whole run", dir.display())]
    #[diagnostic(
        code(trellis::history::shard_run),
        help(
            "combine the shards first: trellis merge SHARD_DIR… --out DIR; then compare or pin the merged run"
        )
    )]
    ShardRun { dir: PathBuf },

    #[error("{} is where `trellis watch` mirrors its current state, not a run", dir.display())]
    #[diagnostic(
        code(trellis::history::watch_latest),
        help(
            "watch rewrites it after every rerun; compare and pin runs made by `trellis run` (`trellis runs` lists them)"
        )
    )]
    WatchLatest { dir: PathBuf },

    #[error("the name `{name}` is already used by run {run_id}")]
    #[diagnostic(
        code(trellis::history::name_taken),
        help("pick another name, or rename that run first")
    )]
    NameTaken { name: String, run_id: String },

    #[error("`{name}` cannot be a run name: {why}")]
    #[diagnostic(code(trellis::history::bad_name))]
    BadName { name: String, why: &'static str },

    #[error("cannot read the table {}", path.display())]
    #[diagnostic(
        code(trellis::history::table),
        help("`trellis report RUN` rebuilds a run's tables from its journal")
    )]
    Table {
        path: PathBuf,
        #[source]
        source: PolarsError,
    },

    #[error(transparent)]
    #[diagnostic(transparent)]
    Report(#[from] ReportError),
}

fn path_text<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&path.to_string_lossy())
}

/// One run of a runs directory, as `trellis runs` lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunEntry {
    /// As text in `--json` (a directory name that is not UTF-8 lossily, rather than
    /// failing the whole list).
    #[serde(serialize_with = "path_text")]
    pub dir: PathBuf,
    pub run_id: String,
    pub name: Option<String>,
    pub baseline: bool,
    /// RFC 3339, UTC; `None` when the run wrote neither tables nor a journal start.
    pub started_at: Option<String>,
    pub duration_ms: Option<f64>,
    /// Trajectories recorded (`None` when `runs.parquet` was not written).
    pub trajectories: Option<u64>,
    pub passed: Option<u64>,
    pub failed: Option<u64>,
    pub errors: Option<u64>,
    pub skipped: Option<u64>,
    /// The simulated user broke character: nothing was checked (`None` for tables from
    /// before the column).
    pub invalid: Option<u64>,
    /// `runs.finished_at` is set: the run reached its end.
    pub finished: bool,
    /// It reached its end having been stopped before its work was done (a signal, an LLM
    /// budget): `runs.interrupted`, or fewer trajectories than `runs.planned_trajectories`.
    pub stopped: bool,
    pub labels: BTreeMap<String, String>,
    pub meta: Option<RunMeta>,
}

impl RunEntry {
    /// Passed over the trajectories that ran (skipped ones left out).
    pub fn pass_rate(&self) -> Option<f64> {
        let passed = self.passed?;
        let ran = passed + self.failed? + self.errors?;
        (ran > 0).then(|| passed as f64 / ran as f64)
    }

    /// The name when it has one, else the id.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.run_id)
    }
}

/// Whether `dir` holds a run: its journal, its tables or its metadata.
pub fn is_run_dir(dir: &Path) -> bool {
    [
        JOURNAL_FILE,
        crate::PLAIN_JOURNAL_FILE,
        crate::tables::RUNS_FILE,
        RUN_META_FILE,
    ]
    .iter()
    .any(|name| dir.join(name).is_file())
}

/// The directory `trellis watch` keeps its whole current state in, next to its reruns.
pub const WATCH_LATEST: &str = "latest";

/// Whether `dir` is a directory `trellis watch` recorded one rerun in: its `run.json` says
/// so, or (reruns recorded before it did) its name has the rerun's `STAMP-rNNNN-SALT` form.
/// Such a directory holds only what reran, so it is never taken for a whole run.
pub fn is_watch_rerun(dir: &Path) -> bool {
    if let Ok(Some(meta)) = RunMeta::read(dir)
        && meta.watch_rerun.is_some()
    {
        return true;
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parts: Vec<&str> = name.split('-').collect();
    matches!(parts.as_slice(), [stamp, rerun, salt]
        if stamp.contains('T')
            && rerun.len() == 5
            && rerun.starts_with('r')
            && rerun[1..].bytes().all(|b| b.is_ascii_digit())
            && salt.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `dir` holds one shard of a run (`trellis run --shard`, marked in its
/// `run.json`): part of a run until `trellis merge` combines the shards.
pub fn is_shard_run(dir: &Path) -> bool {
    matches!(RunMeta::read(dir), Ok(Some(meta)) if meta.shard.is_some())
}

/// Whether `dir` holds only part of a run: a watch rerun ([`is_watch_rerun`]) or one shard
/// ([`is_shard_run`]), or is no run at all: watch's mirror of its state, under whatever name
/// (`latest/`, or the recording of a rerun not finished yet, left behind when watch was
/// killed). History listings, comparisons, trends and shard costs leave such a directory
/// out: its counts are not a whole run's.
pub fn is_part_of_run(dir: &Path) -> bool {
    match RunMeta::read(dir) {
        Ok(Some(meta))
            if meta.watch_rerun.is_some() || meta.shard.is_some() || meta.watch_latest =>
        {
            true
        }
        _ => is_watch_rerun(dir),
    }
}

/// Whether `dir` is the [`WATCH_LATEST`] directory of `runs_dir` (named as a path or as a
/// name under it), which [`list_runs`] leaves out.
fn is_watch_latest(runs_dir: &Path, dir: &Path) -> bool {
    if dir.file_name().is_none_or(|name| name != WATCH_LATEST) {
        return false;
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    same_dir(parent, runs_dir)
}

/// Whether `a` and `b` name the same existing directory (however each is spelled).
pub fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Marks `dir` as rerun `number` of a `trellis watch` session (see [`is_watch_rerun`]).
pub fn mark_watch_rerun(dir: &Path, run_id: &str, number: u64) -> Result<(), HistoryError> {
    RunMeta {
        watch_rerun: Some(number),
        ..RunMeta::marker(run_id)
    }
    .write(dir)
}

/// Marks `dir` as the `latest/` mirror of a `trellis watch` session, holding rerun
/// `run_id`'s state.
pub fn mark_watch_latest(dir: &Path, run_id: &str) -> Result<(), HistoryError> {
    RunMeta {
        watch_latest: true,
        ..RunMeta::marker(run_id)
    }
    .write(dir)
}

impl RunMeta {
    /// The header of run `run_id`'s `run.json` and nothing else: for a directory marked as
    /// what it is (a watch rerun, a rejudge, a variance condition) rather than described.
    pub fn marker(run_id: &str) -> RunMeta {
        RunMeta {
            schema_version: SCHEMA_VERSION,
            run_id: run_id.to_owned(),
            trellis_version: env!("CARGO_PKG_VERSION").to_owned(),
            ..RunMeta::default()
        }
    }

    /// What kind of directory holds the run (`runs.parquet`'s `kind`): `shard`, `merged`,
    /// `watch_rerun`, `watch_latest`, `rejudge`, `variance` or an ordinary `run`.
    pub fn kind(&self, rejudged: bool) -> &'static str {
        if self.variance_condition.is_some() {
            "variance"
        } else if self.watch_latest {
            "watch_latest"
        } else if self.watch_rerun.is_some() {
            "watch_rerun"
        } else if self.shard.is_some() {
            "shard"
        } else if self.merged.is_some() {
            "merged"
        } else if rejudged {
            "rejudge"
        } else {
            "run"
        }
    }
}

/// Every run directly below `runs_dir`, oldest first (by start time, then id: ids carry the
/// start to the millisecond, so runs started within one second keep their order), so the
/// listing and "the last two runs" do not depend on the file system's order. Watch's
/// [`WATCH_LATEST`] mirror, its reruns ([`is_watch_rerun`]) and shards of a run
/// ([`is_shard_run`]) are not whole runs and are left out. A run found in more than one
/// directory (its reports rebuilt elsewhere with `trellis report RUN --out`, or a copy) is
/// listed once, from the directory holding its journal (else the first by path): twice, it
/// was two runs to `compare`'s "the last two", which then refused to compare it with itself.
pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunEntry>, HistoryError> {
    let (runs, mut unreadable) = list_readable_runs(runs_dir)?;
    match unreadable.pop() {
        Some((_, e)) => Err(e),
        None => Ok(runs),
    }
}

/// Run directories whose `run.json` cannot be read, with why.
pub type Unreadable = Vec<(PathBuf, HistoryError)>;

/// As [`list_runs`], with the run directories whose `run.json` cannot be read set apart
/// (with why) instead of failing the listing: `trellis runs` lists the others, and a run
/// named by its exact id or name is found beside a damaged one. What must not guess (the
/// pinned baseline, a prefix of an id) uses [`list_runs`], since a damaged run may be the one
/// meant.
pub fn list_readable_runs(runs_dir: &Path) -> Result<(Vec<RunEntry>, Unreadable), HistoryError> {
    let read = match std::fs::read_dir(runs_dir) {
        Ok(read) => read,
        // No runs directory yet: no runs.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Vec::new(), Vec::new()));
        }
        Err(source) => {
            return Err(HistoryError::Io {
                path: runs_dir.to_path_buf(),
                source,
            });
        }
    };
    let mut runs = Vec::new();
    let mut unreadable = Vec::new();
    for entry in read.flatten() {
        let dir = entry.path();
        // `trellis watch` mirrors its current state there: not a run of its own.
        if entry.file_name() == WATCH_LATEST {
            continue;
        }
        if dir.is_dir() && is_run_dir(&dir) && !is_part_of_run(&dir) {
            match read_run(&dir) {
                Ok(run) => runs.push(run),
                Err(e) => unreadable.push((dir, e)),
            }
        }
    }
    let mut runs = once_per_run(runs);
    runs.sort_by(|a, b| {
        (a.started_at.as_deref(), &a.run_id).cmp(&(b.started_at.as_deref(), &b.run_id))
    });
    unreadable.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((runs, unreadable))
}

/// `runs` with each run id once: of the directories holding one run, the one that holds
/// most of it (a journal; finished; not stopped: a copy taken of a stopped run before it
/// was resumed is not the run), else the first by path. Journals are looked for only where
/// two directories hold the same run, not for every run listed.
fn once_per_run(runs: Vec<RunEntry>) -> Vec<RunEntry> {
    let rank = |r: &RunEntry| {
        (
            trellis_journal::find(&r.dir).is_none(),
            !r.finished,
            r.stopped,
            r.dir.clone(),
        )
    };
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut kept: Vec<RunEntry> = Vec::with_capacity(runs.len());
    for run in runs {
        match at.get(&run.run_id) {
            Some(&i) => {
                if rank(&run) < rank(&kept[i]) {
                    kept[i] = run;
                }
            }
            None => {
                at.insert(run.run_id.clone(), kept.len());
                kept.push(run);
            }
        }
    }
    kept
}

/// Reads what a run directory says about its run: `runs.parquet` when it was written,
/// `run.json`, and the journal's first line for a run that never wrote its tables.
pub fn read_run(dir: &Path) -> Result<RunEntry, HistoryError> {
    let meta = RunMeta::read(dir)?;
    let fallback_id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entry = RunEntry {
        dir: dir.to_path_buf(),
        run_id: meta
            .as_ref()
            .map(|m| m.run_id.clone())
            .filter(|id| !id.is_empty())
            .unwrap_or(fallback_id),
        name: meta.as_ref().and_then(|m| m.name.clone()),
        baseline: meta.as_ref().is_some_and(|m| m.baseline),
        started_at: None,
        duration_ms: None,
        trajectories: None,
        passed: None,
        failed: None,
        errors: None,
        skipped: None,
        invalid: None,
        finished: false,
        stopped: false,
        labels: meta.as_ref().map(|m| m.labels.clone()).unwrap_or_default(),
        meta,
    };
    let runs_file = dir.join(crate::tables::RUNS_FILE);
    if runs_file.is_file() {
        // A table from another version (or damaged) leaves the counts unknown rather than
        // hiding the run from the listing.
        if let Ok(row) = read_runs_row(&runs_file) {
            entry.run_id = row.run_id;
            entry.started_at = Some(row.started_at);
            entry.duration_ms = row.duration_ms;
            entry.finished = row.finished;
            entry.stopped = row.stopped;
            entry.trajectories = Some(row.trajectories);
            entry.passed = Some(row.passed);
            entry.failed = Some(row.failed);
            entry.errors = Some(row.errors);
            entry.skipped = Some(row.skipped);
            entry.invalid = row.invalid;
        }
    }
    if entry.started_at.is_none() {
        entry.started_at = journal_start(dir);
    }
    Ok(entry)
}

struct RunsRow {
    run_id: String,
    started_at: String,
    duration_ms: Option<f64>,
    finished: bool,
    stopped: bool,
    trajectories: u64,
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
    invalid: Option<u64>,
}

fn read_runs_row(path: &Path) -> PolarsResult<RunsRow> {
    let columns = crate::columns::read(
        path,
        &[
            "run_id",
            "started_at",
            "finished_at",
            "duration_ms",
            "trajectories",
            "passed",
            "failed",
            "errors",
            "skipped",
            "invalid",
            "planned_trajectories",
            "interrupted",
        ],
    )?;
    let text = |name: &str| -> PolarsResult<Option<String>> {
        Ok(columns.strings(name)?.into_iter().next().flatten())
    };
    let count = |name: &str| -> PolarsResult<u64> {
        Ok(columns
            .unsigned(name)?
            .into_iter()
            .next()
            .flatten()
            .unwrap_or(0))
    };
    let finished = text("finished_at")?.is_some();
    // Tables from before `interrupted` lack it: their stopped runs are short of their plan.
    let interrupted = columns.has("interrupted")
        && columns
            .bools("interrupted")?
            .into_iter()
            .next()
            .flatten()
            .unwrap_or(false);
    let short = columns.has("planned_trajectories")
        && count("trajectories")? < count("planned_trajectories")?;
    Ok(RunsRow {
        run_id: text("run_id")?.unwrap_or_default(),
        started_at: text("started_at")?.unwrap_or_default(),
        duration_ms: columns.floats("duration_ms")?.into_iter().next().flatten(),
        finished,
        stopped: finished && (interrupted || short),
        trajectories: count("trajectories")?,
        passed: count("passed")?,
        failed: count("failed")?,
        errors: count("errors")?,
        skipped: count("skipped")?,
        invalid: if columns.has("invalid") {
            Some(count("invalid")?)
        } else {
            None
        },
    })
}

/// `started_at` from the journal's `run_started` line.
fn journal_start(dir: &Path) -> Option<String> {
    let mut journal = crate::journal::JournalReader::open(&trellis_journal::path_in(dir)).ok()?;
    match journal.next_entry().ok()?? {
        trellis_records::JournalEntry::RunStarted(info) => Some(info.started_at.clone()),
        _ => None,
    }
}

/// Finds a run: a directory path that holds a run, else a directory of `runs_dir` by its
/// name, a run id, a unique run id prefix or a name under `runs_dir`. `pinned` (or
/// `baseline`) is the pinned baseline. A watch rerun's directory, one shard of a run, and
/// watch's [`WATCH_LATEST`] mirror in `runs_dir`, are refused by path and by name and never
/// matched by id, as [`list_runs`] leaves them out: a pin or a name written there would never be
/// found again.
pub fn resolve_run(runs_dir: &Path, what: &str) -> Result<RunEntry, HistoryError> {
    // Empty, it would be the start of every run id and the runs directory itself.
    if what.trim().is_empty() {
        return Err(HistoryError::EmptyRunName);
    }
    let whole = |dir: &Path| {
        if is_watch_rerun(dir) {
            Err(HistoryError::WatchRerun {
                dir: dir.to_path_buf(),
            })
        } else if is_shard_run(dir) {
            Err(HistoryError::ShardRun {
                dir: dir.to_path_buf(),
            })
        } else if is_watch_latest(runs_dir, dir) {
            Err(HistoryError::WatchLatest {
                dir: dir.to_path_buf(),
            })
        } else {
            read_run(dir)
        }
    };
    // A bare word that is also a run directory (here, or in `runs_dir`): which run is meant
    // cannot be told when the word also names another run, a keyword's pinned run or a
    // name (`trellis runs name` refuses a name a directory has, but a later `--out` may take
    // it), and a gate must not guess. A path (`./baseline`, `runs/nightly`) names the
    // directory alone.
    let bare = !what.contains(['/', '\\']);
    let as_path = Path::new(what);
    let directory = [as_path.to_path_buf(), runs_dir.join(what)]
        .into_iter()
        .find(|dir| bare && dir.is_dir() && is_run_dir(dir));
    let clash = |run: &RunEntry, dir: PathBuf| HistoryError::NameAndDirectory {
        named: run.run_id.clone(),
        dir,
    };
    if what == "pinned" || what == "baseline" {
        if !runs_dir.is_dir() {
            // A first `run --baseline`: nothing to compare with yet, and nothing pinned.
            return Err(HistoryError::NothingPinned {
                dir: runs_dir.to_path_buf(),
            });
        }
        let pinned = match (pinned(list_runs(runs_dir)?, runs_dir), &directory) {
            (Err(HistoryError::NothingPinned { .. }), Some(dir)) => {
                let word = if what == "pinned" {
                    "pinned"
                } else {
                    "baseline"
                };
                return Err(HistoryError::NothingPinnedButDirectory {
                    word,
                    dir: dir.clone(),
                });
            }
            (pinned, _) => pinned?,
        };
        if let Some(dir) = directory
            && read_run(&dir).is_ok_and(|r| r.run_id != pinned.run_id)
        {
            return Err(clash(&pinned, dir));
        }
        return Ok(pinned);
    }
    if as_path.is_dir() && is_run_dir(as_path) && !(bare && directory.is_some()) {
        return whole(as_path);
    }
    let not_found = || {
        // A path to a directory that is not a run (`compare A /etc`): said as such, not as a
        // run missing from the runs directory.
        if !bare && as_path.is_dir() {
            return HistoryError::NotARunDir {
                dir: as_path.to_path_buf(),
            };
        }
        HistoryError::NoSuchRun {
            what: what.to_owned(),
            dir: runs_dir.to_path_buf(),
        }
    };
    if let Some(dir) = directory {
        let run = whole(&dir)?;
        if runs_dir.is_dir()
            && let Some(named) = list_runs(runs_dir)?
                .into_iter()
                .find(|r| r.name.as_deref() == Some(what) && r.run_id != run.run_id)
        {
            return Err(clash(&named, dir));
        }
        return Ok(run);
    }
    if !runs_dir.is_dir() {
        return Err(not_found());
    }
    // An exact id or name is unique among runs: found beside a damaged run. A prefix may
    // be the damaged run's, so it is matched only when every run reads.
    let (runs, mut unreadable) = list_readable_runs(runs_dir)?;
    if let Some(run) = runs.iter().find(|r| r.run_id == what) {
        return Ok(run.clone());
    }
    if let Some((_, e)) = unreadable.pop() {
        return Err(e);
    }
    if let Some(run) = runs.iter().find(|r| r.name.as_deref() == Some(what)) {
        // A name that is also the start of another run's id (given to it before that run
        // existed): which run is meant cannot be told, and a gate must not guess.
        let also: Vec<&RunEntry> = runs
            .iter()
            .filter(|r| r.run_id != run.run_id && r.run_id.starts_with(what))
            .collect();
        if also.is_empty() {
            return Ok(run.clone());
        }
        return Err(HistoryError::Ambiguous {
            what: what.to_owned(),
            dir: runs_dir.to_path_buf(),
            matches: std::iter::once(format!("{} (named `{what}`)", run.run_id))
                .chain(also.iter().map(|r| r.run_id.clone()))
                .collect(),
        });
    }
    let prefixed: Vec<&RunEntry> = runs.iter().filter(|r| r.run_id.starts_with(what)).collect();
    match prefixed.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(not_found()),
        many => Err(HistoryError::Ambiguous {
            what: what.to_owned(),
            dir: runs_dir.to_path_buf(),
            matches: many.iter().map(|r| r.run_id.clone()).collect(),
        }),
    }
}

fn pinned(runs: Vec<RunEntry>, runs_dir: &Path) -> Result<RunEntry, HistoryError> {
    runs.into_iter()
        .rev()
        .find(|r| r.baseline)
        .ok_or_else(|| HistoryError::NothingPinned {
            dir: runs_dir.to_path_buf(),
        })
}

/// The two most recent runs that finished, older first, for `trellis compare` without
/// arguments.
pub fn last_two(runs_dir: &Path) -> Result<(RunEntry, RunEntry), HistoryError> {
    let mut finished: Vec<RunEntry> = list_runs(runs_dir)?
        .into_iter()
        .filter(|r| r.finished)
        .collect();
    let head = finished.pop();
    let base = finished.pop();
    match (base, head) {
        (Some(base), Some(head)) => Ok((base, head)),
        _ => Err(HistoryError::NotEnoughRuns {
            what: format!(
                "compare needs two finished runs in {}; name them: trellis compare BASE HEAD",
                runs_dir.display()
            ),
        }),
    }
}

/// The runs directory `run` belongs to: the one its directory sits in. `runs pin PATH` and
/// `runs name PATH` keep a pin and a name unique there, wherever `--dir` points.
fn runs_dir_of(run: &RunEntry) -> PathBuf {
    run.dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Gives `run` a name, refusing one another run of its runs directory already has, one
/// that is another run's id (ids are looked up before names, so it could never be used) or
/// the start of one (which names that run as a prefix of its id),
/// and one that is the name of another directory of the runs directory, or `latest`:
/// [`resolve_run`] looks a bare word up as a directory first, so the name would reach that
/// directory (watch's [`WATCH_LATEST`] mirror, a shard, a watch rerun, a run `--out` wrote
/// there) and never this run.
pub fn name_run(run: &RunEntry, name: &str) -> Result<(), HistoryError> {
    let runs_dir = &runs_dir_of(run);
    let bad = |why| HistoryError::BadName {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() || name.len() > 100 {
        return Err(bad("a name has 1 to 100 characters"));
    }
    if name.contains(['/', '\\']) || name.chars().any(char::is_control) {
        return Err(bad("a name has no slashes or control characters"));
    }
    if name == "pinned" || name == "baseline" {
        return Err(bad("`pinned` and `baseline` refer to the pinned run"));
    }
    if name == WATCH_LATEST {
        return Err(bad(
            "`latest` is the directory where `trellis watch` mirrors its current state, \
             which `compare` and `runs` look the word up as first",
        ));
    }
    if runs_dir.is_dir() {
        for other in list_runs(runs_dir)? {
            if other.run_id != run.run_id && other.name.as_deref() == Some(name) {
                return Err(HistoryError::NameTaken {
                    name: name.to_owned(),
                    run_id: other.run_id,
                });
            }
            if other.run_id != run.run_id && other.run_id == name {
                return Err(bad("it is another run's id"));
            }
            if other.run_id != run.run_id && other.run_id.starts_with(name) {
                return Err(bad(
                    "it is the start of another run's id, which `compare` and `runs` take as \
                     that run",
                ));
            }
            // `runs/NAME` is looked up as a directory first: the name would never reach
            // this run.
            if other.dir != run.dir && other.dir.file_name().is_some_and(|d| d == name) {
                return Err(bad("it is another run's directory name"));
            }
        }
        if other_directory(runs_dir, run, name) {
            return Err(bad(
                "it is the name of another directory of the runs directory (a shard, a \
                 `trellis watch` rerun, or a run that is not listed), which `compare` and \
                 `runs` look the word up as first",
            ));
        }
    }
    let mut meta = meta_of(run);
    meta.name = Some(name.to_owned());
    meta.write(&run.dir)
}

/// Whether `runs_dir/name` is a directory other than `run`'s own.
fn other_directory(runs_dir: &Path, run: &RunEntry, name: &str) -> bool {
    let dir = runs_dir.join(name);
    dir.is_dir() && !same_dir(&dir, &run.dir)
}

/// Pins `run` as the baseline of its runs directory, unpinning the run that was.
pub fn pin_run(run: &RunEntry) -> Result<(), HistoryError> {
    let runs_dir = &runs_dir_of(run);
    if runs_dir.is_dir() {
        for other in list_runs(runs_dir)? {
            if other.baseline && other.dir != run.dir {
                let mut meta = meta_of(&other);
                meta.baseline = false;
                meta.write(&other.dir)?;
            }
        }
    }
    let mut meta = meta_of(run);
    meta.baseline = true;
    meta.write(&run.dir)
}

/// Why `run` cannot serve as a baseline, if it cannot: it never reached its end, was
/// stopped before its work was done, or brought no trajectory to a verdict (every one
/// ended in an error or was skipped: an agent that was down, say).
pub fn empty_baseline(run: &RunEntry) -> Option<HistoryError> {
    // What each case would make of later comparisons.
    let part = "as the baseline it would hold the agent to only part of its plan";
    let why = if !run.finished {
        format!("never reached its end: {part}")
    } else if run.stopped {
        format!("was stopped before its work was done: {part}")
    } else {
        let decided = run.passed.unwrap_or(0) + run.failed.unwrap_or(0);
        let total = run.trajectories.unwrap_or(0);
        if decided > 0 {
            return None;
        }
        let nothing = "as the baseline it would hold the agent to nothing: every later run \
                       would compare equal to it, however broken";
        match (total, run.errors.unwrap_or(0)) {
            (0, _) => format!("recorded no trajectory: {nothing}"),
            (n, e) if e == n => format!(
                "checked nothing: all {n} of its trajectories ended in an error (an agent down, or \
                 the checks' judge or cache failing?); {nothing}"
            ),
            (n, _) => {
                format!("checked nothing: none of its {n} trajectories passed or failed; {nothing}")
            }
        }
    };
    Some(HistoryError::EmptyBaseline {
        run: run.label().to_owned(),
        why,
    })
}

/// Unpins `run`.
pub fn unpin_run(run: &RunEntry) -> Result<(), HistoryError> {
    let mut meta = meta_of(run);
    meta.baseline = false;
    meta.write(&run.dir)
}

fn meta_of(run: &RunEntry) -> RunMeta {
    run.meta.clone().unwrap_or_else(|| RunMeta {
        schema_version: SCHEMA_VERSION,
        run_id: run.run_id.clone(),
        ..RunMeta::default()
    })
}

/// Every agent turn's latency in milliseconds, replayed prefix turns left out (as in the
/// run's statistics), by agent and by scenario: what `compare` ranks to tell a slower agent
/// from noise, for the whole run, each agent and each scenario. Read from `turns.parquet`,
/// else from the journal; `None` when neither can be read.
pub fn turn_latencies(dir: &Path) -> Option<RunLatencies> {
    latencies_of(dir, false)
}

/// [`turn_latencies`] of the turns the agent answered: a faulted turn's latency is its fault
/// (a hung agent's is its timeout), which says nothing of how fast the agent answers or how
/// busy the machine was. What an earlier run's spread is taken from.
pub fn answered_turn_latencies(dir: &Path) -> Option<AgentLatencies> {
    latencies_of(dir, true).map(|l| l.agents)
}

/// Turn latencies (ms) by agent name, each agent's in the order its turns were recorded.
pub type AgentLatencies = std::collections::BTreeMap<String, Vec<f64>>;

/// A scenario as the run's statistics key it: (suite, scenario id, agent).
pub type ScenarioKey = (String, String, String);

/// A run's turn latencies (ms), by agent and by scenario.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunLatencies {
    pub agents: AgentLatencies,
    pub scenarios: BTreeMap<ScenarioKey, Vec<f64>>,
}

impl RunLatencies {
    /// Adds a turn: to its agent's, and, `by_scenario`, to its scenario's (whose key is
    /// three strings made for each turn: left out where only agents are read).
    fn push(&mut self, suite: &str, scenario: &str, agent: &str, ms: f64, by_scenario: bool) {
        match self.agents.get_mut(agent) {
            Some(turns) => turns.push(ms),
            None => {
                self.agents.insert(agent.to_owned(), vec![ms]);
            }
        }
        if by_scenario {
            let key = (suite.to_owned(), scenario.to_owned(), agent.to_owned());
            self.scenarios.entry(key).or_default().push(ms);
        }
    }
}

/// `answered_only`: the turns the agent answered, by agent alone (what an earlier run's
/// spread reads: up to [`crate::compare::SPREAD_WINDOW`] runs, whose scenarios nothing reads).
fn latencies_of(dir: &Path, answered_only: bool) -> Option<RunLatencies> {
    let from_table = || -> PolarsResult<RunLatencies> {
        let mut names = vec!["suite", "scenario", "agent", "latency_ms", "replay"];
        if answered_only {
            names.push("fault_category");
        }
        let columns = crate::columns::read(&dir.join(crate::tables::TURNS_FILE), &names)?;
        let faulted = if answered_only {
            columns
                .strings("fault_category")?
                .into_iter()
                .map(|f| f.is_some())
                .collect()
        } else {
            Vec::new()
        };
        let mut latencies = RunLatencies::default();
        for (i, ((((suite, scenario), agent), ms), replay)) in columns
            .strings("suite")?
            .into_iter()
            .zip(columns.strings("scenario")?)
            .zip(columns.strings("agent")?)
            .zip(columns.floats("latency_ms")?)
            .zip(columns.bools("replay")?)
            .enumerate()
        {
            if replay == Some(true) || faulted.get(i).copied().unwrap_or(false) {
                continue;
            }
            if let Some(ms) = ms.filter(|ms| ms.is_finite()) {
                latencies.push(
                    suite.as_deref().unwrap_or_default(),
                    scenario.as_deref().unwrap_or_default(),
                    agent.as_deref().unwrap_or_default(),
                    ms,
                    !answered_only,
                );
            }
        }
        Ok(latencies)
    };
    if let Ok(latencies) = from_table() {
        return Some(latencies);
    }
    let mut journal = crate::journal::JournalReader::open(&trellis_journal::path_in(dir)).ok()?;
    let mut latencies = RunLatencies::default();
    while let Some(entry) = journal.next_entry().ok()? {
        if let trellis_records::JournalEntry::Node(node) = entry {
            for turn in node.turns.iter().filter(|t| {
                !t.replay && t.latency_ms.is_finite() && !(answered_only && t.fault.is_some())
            }) {
                latencies.push(
                    &node.suite,
                    &node.scenario,
                    &node.agent,
                    turn.latency_ms,
                    !answered_only,
                );
            }
        }
    }
    Some(latencies)
}

/// Microseconds of agent turns by (suite, scenario id): [`scenario_costs`].
pub type ScenarioCosts = BTreeMap<(String, String), u64>;

/// Each scenario's measured cost in a run, by (suite, scenario id): the latency of its agent
/// turns summed over its execution nodes, replayed prefix turns left out (as in the run's
/// statistics), in whole microseconds; what `trellis run --shard` balances shards by. Read
/// from `turns.parquet`.
pub fn scenario_costs(dir: &Path) -> Result<ScenarioCosts, HistoryError> {
    let path = dir.join(crate::tables::TURNS_FILE);
    let read = || -> PolarsResult<ScenarioCosts> {
        let columns = crate::columns::read(&path, &["suite", "scenario", "latency_ms", "replay"])?;
        let suites = columns.strings("suite")?;
        let scenarios = columns.strings("scenario")?;
        let latency = columns.floats("latency_ms")?;
        let replay = columns.bools("replay")?;
        let mut costs = ScenarioCosts::new();
        for (((suite, scenario), ms), replay) in
            suites.into_iter().zip(scenarios).zip(latency).zip(replay)
        {
            let (Some(suite), Some(scenario)) = (suite, scenario) else {
                continue;
            };
            let slot = costs.entry((suite, scenario)).or_default();
            if replay != Some(true)
                && let Some(ms) = ms.filter(|ms| ms.is_finite() && *ms > 0.0)
            {
                // Whole microseconds: shards add these up and must agree on every sum.
                *slot = slot.saturating_add((ms * 1000.0).round() as u64);
            }
        }
        Ok(costs)
    };
    read().map_err(|source| HistoryError::Table { path, source })
}

/// The most recent finished whole run of `runs_dir` that ran exactly the suites `suites`
/// (by name, in load order) and whose turns can be read, with its [`scenario_costs`]:
/// what shards are balanced by when no run is named. `None` when there is none.
pub fn latest_costs(
    runs_dir: &Path,
    suites: &[String],
) -> Result<Option<(RunEntry, ScenarioCosts)>, HistoryError> {
    for run in list_runs(runs_dir)?.into_iter().rev() {
        if !run.finished || run_suites(&run.dir).as_deref() != Some(suites) {
            continue;
        }
        if let Ok(costs) = scenario_costs(&run.dir) {
            return Ok(Some((run, costs)));
        }
    }
    Ok(None)
}

/// The suites a run ran (`runs.parquet`'s `suites`).
fn run_suites(dir: &Path) -> Option<Vec<String>> {
    let columns = crate::columns::read(&dir.join(crate::tables::RUNS_FILE), &["suites"]).ok()?;
    let names = columns.string_lists("suites").ok()?.into_iter().next()??;
    names.into_iter().collect()
}

/// The statistics of a run: its `summary.json`, else its journal replayed.
pub fn run_stats(dir: &Path) -> Result<crate::stats::RunStats, HistoryError> {
    let path = dir.join(crate::SUMMARY_FILE);
    if let Ok(text) = std::fs::read_to_string(&path)
        && let Ok(summary) = serde_json::from_str::<crate::Summary>(&text)
    {
        return Ok(summary.stats);
    }
    Ok(crate::stats::RunStats::from_run_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::{RunEntry, once_per_run, redact_url};

    /// A copy of a run taken while it was stopped, before it was resumed, is not the run:
    /// listed once, the run is the finished one, whatever their paths' order.
    #[test]
    fn of_two_directories_holding_one_run_the_finished_one_is_listed() {
        let entry = |dir: &str, finished: bool, stopped: bool| RunEntry {
            dir: dir.into(),
            run_id: "20261206T044453.101Z-ee4f".into(),
            finished,
            stopped,
            ..RunEntry::default()
        };
        let kept = once_per_run(vec![
            entry("/nowhere/runs/a-copy", true, true),
            entry("/nowhere/runs/r4", true, false),
        ]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].dir, std::path::Path::new("/nowhere/runs/r4"));
    }

    #[test]
    fn urls_lose_credentials_query_and_fragment() {
        assert_eq!(
            redact_url("https://user:secret@agent.example:8443/v1/chat?token=abc#frag"),
            "https://agent.example:8443/v1/chat"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:8080/agent"),
            "http://127.0.0.1:8080/agent"
        );
        // A templated URL does not parse; it is cut by hand.
        assert_eq!(
            redact_url("https://bot:{{ env.KEY }}@h/{{ env.PATH }}?key={{ env.KEY }}"),
            "https://h/{{ env.PATH }}"
        );
    }
}
