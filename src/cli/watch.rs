//! `trellis watch`: rerun suites as they are edited, and only what an edit changed.
//!
//! The loop: wait for a change to a file the project loads (or any `*.kdl` in a watched
//! directory), reload and revalidate, compare every scenario's fingerprints with the last
//! run's ([`trellis_engine::fingerprint`]), and run the plan again with the last runs'
//! turns on hand ([`TurnMemo`]): a conversation that repeats a recorded one is answered
//! from the records, so the agent is called only from the first changed step of a changed
//! branch; an edit to checks alone re-checks the recorded transcripts with no agent call;
//! a scenario that `needs` a scenario whose conversation changed talks to the agent afresh.
//! Each rerun is recorded like a run, in its own directory under `--out`.
//!
//! A broken edit prints its diagnostics and keeps the last results; watch never exits
//! because of a suite. A save during a rerun stops it (no new agent call starts) and starts
//! the next. Files are watched through their directories, so editors that save by writing
//! a temporary file and renaming it over the original, and files added, removed or renamed,
//! are all seen. Change events are debounced on the event loop itself: idle, the process
//! waits on the kernel's notifications and uses no CPU.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::IsTerminal;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use trellis_engine::event::{self, Event};
use trellis_engine::execute::{self, RunOptions, TurnMemo};
use trellis_engine::fingerprint::{self, Change, ScenarioFingerprints};
use trellis_engine::plan::Plan;
use trellis_engine::record::{CriterionStatus, RunSummary, TrajectoryRecord, TrajectoryStatus};
use trellis_engine::transport::http::HttpTransport;

use super::console::{errln, outln};
use super::recorder::{Record, source};
use super::run::new_run_id;
use super::stop::Signals;
use super::{EXIT_INVALID, PathArgs, SelectArgs};

pub mod bench;
mod serve;

/// How long the files must stay quiet after a change before reloading: an editor's save
/// (write, rename, chmod) arrives as one burst.
const DEBOUNCE: Duration = Duration::from_millis(25);
/// Failures that did not rerun listed under a rerun on a terminal; the rest are counted.
const STANDING_SHOWN: usize = 20;
/// How long calls in flight may finish once a newer save stops a rerun.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How many scenarios gone from the suites keep their recorded turns, for when they come
/// back: a dataset suite deleted whole must not keep every row's turns for the session.
const GONE_KEPT: usize = 1024;

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    paths: PathArgs,
    #[command(flatten)]
    select: SelectArgs,
    /// Where reruns are recorded, one run directory each (DIR/<run-id>). Default: runs/
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// A check that did not run, or a trajectory that was skipped, fails its trajectory.
    #[arg(long)]
    strict: bool,
    /// Agent calls in flight at once.
    #[arg(long, short = 'j', default_value_t = 32, value_parser = super::jobs_in_range)]
    pub(super) jobs: usize,
    /// Serve the latest report on http://127.0.0.1:PORT/ and reload the open tab after each
    /// rerun. PORT defaults to 7357; 0 picks a free port (printed).
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "7357")]
    serve: Option<u16>,
    /// Cache LLM answers (judges, the simulated user) in this directory, so a rerun asks
    /// again only what changed (an edited judge re-scores through the cache). Default:
    /// OUT/.llm-cache.
    #[arg(long, value_name = "DIR")]
    llm_cache: Option<PathBuf>,
    /// read-write (default), off, or replay-only (a miss is an error naming the call).
    #[arg(long, value_enum, default_value_t = super::LlmCacheMode::ReadWrite)]
    llm_cache_mode: super::LlmCacheMode,
    /// Receive the agents' OpenTelemetry spans on this address for the whole session
    /// (OTLP/HTTP, `POST /v1/traces`), e.g. 127.0.0.1:4318; point the agents'
    /// OTEL_EXPORTER_OTLP_ENDPOINT at it. Agents with `spans #true` get a receiver on a free
    /// port without it.
    #[arg(long, value_name = "ADDR", value_parser = super::receiver_address)]
    otlp_receiver: Option<std::net::SocketAddr>,
}

/// The directory under `--out` that holds the whole state after the last rerun.
pub const LATEST: &str = trellis_reports::history::WATCH_LATEST;

/// Exit code after Ctrl-C or SIGTERM: watch only ends when told to.
const EXIT_STOPPED: u8 = super::stop::EXIT_INTERRUPTED;

pub fn watch(args: WatchArgs) -> u8 {
    // The agents are known at each rerun; said here for the limit itself.
    if let (_, Some(why)) = crate::descriptors::jobs_within_limit(args.jobs, Default::default()) {
        errln!("warning: {why}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return EXIT_INVALID;
        }
    };
    let code = runtime.block_on(Session::start(args));
    runtime.shutdown_background();
    code
}

/// Why a scenario or a trajectory reran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    Unchanged,
    /// Gone from an earlier rerun and back as it was: answered from the records.
    Back,
    /// Only its checks changed: re-checked against the recorded turns.
    Checks,
    /// Only its `repeat` changed: the repetitions added run, those taken away are gone,
    /// the others are answered from the records.
    Repeat,
    /// Unchanged, but its agent could not be reached last time (down, not started, rate
    /// limited past waiting): any save asks it again, the turns it answered reused. An
    /// agent started after watch was needed an edit to be asked at all.
    Unreached,
    /// Only what a tool answers changed (a mock, a state change, a policy: nothing the
    /// agent is told): the turns that called an edited tool talk afresh, the others are
    /// answered from the records.
    Mocks,
    /// A scenario it `needs` changed what it says to the agent.
    Dependency,
    /// Gone and back (as it was or edited), but it `needs` scenarios that may have talked to
    /// the agent afresh while it was away (no finished run compared them for it): it talks
    /// afresh.
    BackAfterNeeds,
    /// What shapes every answer besides its steps changed: its agent, persona, tools,
    /// `user-context`, settings, or the dataset row of an instance. Every trajectory of it
    /// talks afresh.
    Setup,
    /// Its steps changed: the trajectories through a changed step talk afresh from it.
    Steps,
    /// Asked for from the keyboard: talks afresh, whatever changed.
    Asked,
    /// First run of it.
    New,
}

impl Why {
    /// Whether a scenario rerun for this reason makes what `needs` it talk afresh: its
    /// agent may have been asked anew (not only its checks or `repeat` changed).
    fn moves_dependants(self) -> bool {
        self >= Why::Dependency || matches!(self, Why::Unreached | Why::Mocks)
    }

    fn label(self) -> &'static str {
        match self {
            Why::Unchanged => "unchanged",
            Why::Back => "back",
            Why::Checks => "checks changed",
            Why::Repeat => "repeat changed",
            Why::Unreached => "its agent was not reached last time: asked again",
            Why::Mocks => "a tool's answers changed: turns that called it talk afresh",
            Why::Dependency => "dependency changed",
            Why::BackAfterNeeds => "back, talking afresh after what it needs",
            Why::Setup => {
                "setup changed (its agent, persona, tools, context, settings or dataset row)"
            }
            Why::Steps => "steps changed",
            Why::Asked => "asked to talk afresh",
            Why::New => "new",
        }
    }
}

/// A scenario that was planned and is gone from the suites or the selection.
struct Gone {
    /// Its fingerprints when last planned.
    prints: ScenarioFingerprints,
    /// The salt its recorded turns are kept under.
    salt: u64,
    /// The rerun that dropped it: the oldest are forgotten first.
    rerun: u64,
}

/// A change notification, with when it arrived.
struct Changed {
    paths: Vec<PathBuf>,
    at: Instant,
    /// Asked for from the keyboard ([`asks_from_stdin`]): every scenario talks afresh.
    afresh: bool,
}

struct Session {
    args: WatchArgs,
    roots: Vec<PathBuf>,
    out_root: PathBuf,
    watcher: RecommendedWatcher,
    changes: mpsc::UnboundedReceiver<Vec<PathBuf>>,
    /// Reruns asked for from the keyboard ([`asks_from_stdin`]).
    asks: Option<mpsc::Receiver<()>>,
    /// A person at a terminal can ask for them: each rerun's footer says how.
    keys: bool,
    /// What `trellis check` warns of in the suites as last loaded, rendered, and what was
    /// last printed of them (off a terminal they are printed when they change; on one,
    /// under each rerun, whose screen is redrawn).
    warnings: Vec<String>,
    warnings_said: Vec<String>,
    /// Changed paths taken in and not acted on yet, and since when.
    pending: Vec<PathBuf>,
    pending_since: Option<Instant>,
    /// Directories watched with everything below them.
    recursive: BTreeSet<PathBuf>,
    /// The directories given on the command line (canonical), watched again when one is
    /// removed and comes back (`git checkout` away and back): the kernel drops a watch with
    /// its directory.
    root_dirs: BTreeSet<PathBuf>,
    /// Directories watched for their own files.
    watched: BTreeSet<PathBuf>,
    /// Files the last good load read (canonical paths).
    known: BTreeSet<PathBuf>,
    /// The suite files as the last load read them: a save parses again only what changed.
    load_cache: trellis_dsl::LoadCache,
    memo: Arc<TurnMemo>,
    /// One HTTP connection pool for every rerun.
    transport: HttpTransport,
    /// Starts the builtin agents once for the session: reruns do not restart them.
    launcher: Arc<dyn trellis_engine::execute::Launcher>,
    /// One LLM response cache for every rerun.
    llm_cache: trellis_engine::llm::LlmCache,
    /// The OTLP receiver for `spans #true` agents, started by the first rerun that has one
    /// and kept for the session: the builtins kept running send to its address.
    receiver: Option<Arc<trellis_engine::otel::SpanReceiver>>,
    /// `suite/scenario` of every scenario the last run planned.
    planned: BTreeSet<String>,
    /// Fingerprints of the last run's scenarios.
    last: Option<BTreeMap<String, ScenarioFingerprints>>,
    /// The salt of each planned scenario's recorded turns in the last run.
    salts: HashMap<String, u64>,
    /// Scenarios planned before and gone since (removed, or out of the selection), at most
    /// [`GONE_KEPT`]: their salts keep their turns in the memo, so one that comes back as
    /// it was (a save in two writes, `git stash` and `pop`) is answered from the records.
    gone: BTreeMap<String, Gone>,
    /// Every trajectory's last result: a line is shown when it changes.
    results: HashMap<ResultKey, Standing>,
    /// Bumped when a scenario must talk to its agent afresh (a dependency changed).
    generations: HashMap<String, u64>,
    /// The last run finished (a stopped one leaves work to redo).
    complete: bool,
    /// The last load failed: the next good one says so.
    broken: bool,
    /// Files changed since the last finished rerun (or since the session started): what
    /// the next rerun covers, so its header names them all, not only the save that started
    /// it after a broken save or a stopped rerun.
    since_finished: BTreeSet<PathBuf>,
    reruns: u64,
    tty: bool,
    server: Option<serve::Server>,
    /// The hold on `latest/` for the session ([`super::recorder::claim_watch_dir`]).
    _claim: super::recorder::OutClaim,
    /// The runs directory and `latest/`, each when this session made it: removed at the
    /// end when nothing was recorded in them (a session that never ran anything).
    made: [Option<PathBuf>; 2],
    /// The directory of the rerun under way, or of the last one.
    rerun_dir: Option<PathBuf>,
}

impl Session {
    async fn start(args: WatchArgs) -> u8 {
        let roots: Vec<PathBuf> = if args.paths.paths.is_empty() {
            vec![PathBuf::from(super::DEFAULT_SUITES)]
        } else {
            args.paths.paths.clone()
        };
        // Nothing to watch would wait for ever: a mistyped path is a usage error.
        if let Some(missing) = roots.iter().find(|r| !r.exists()) {
            errln!("error: {} does not exist", missing.display());
            return EXIT_INVALID;
        }
        let out_root = args.out.clone().unwrap_or_else(|| PathBuf::from("runs"));
        // `latest/` is rewritten on every rerun; a run `trellis run` recorded there (its
        // `run.json` is not watch's own mark) would be lost.
        let latest = out_root.join(LATEST);
        if let Ok(Some(meta)) = trellis_reports::history::RunMeta::read(&latest)
            && !meta.watch_latest
        {
            errln!(
                "error: {} holds run {} of `trellis run`, and watch rewrites that directory \
                 after every rerun; move the run elsewhere or give watch another --out",
                latest.display(),
                meta.run_id
            );
            return EXIT_INVALID;
        }
        // Made by this session: left as it was found when the session cannot start.
        let made = [out_root.clone(), latest.clone()].map(|dir| !dir.exists());
        let claim = match super::recorder::claim_watch_dir(&latest) {
            Ok(claim) => claim,
            Err(e) => {
                errln!("error: {e}");
                return EXIT_INVALID;
            }
        };
        let (tx, changes) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Reading a file (our own reloads) and attribute changes are not edits.
            if let Ok(event) = event
                && !matches!(
                    event.kind,
                    EventKind::Access(_)
                        | EventKind::Modify(notify::event::ModifyKind::Metadata(_))
                )
                && !event.paths.is_empty()
            {
                let _ = tx.send(event.paths);
            }
        });
        let watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                errln!("error: cannot watch files: {e}");
                return EXIT_INVALID;
            }
        };
        let server = match args.serve {
            Some(port) => match serve::Server::start(port).await {
                Ok(server) => {
                    outln!("serving the latest report on {}", server.url());
                    Some(server)
                }
                Err(e) => {
                    errln!("error: cannot serve on 127.0.0.1:{port}: {e}");
                    // An empty `latest/` (its lock alone) left behind read as a session's.
                    drop(claim);
                    if made[1] {
                        let _ = std::fs::remove_dir_all(&latest);
                    }
                    if made[0] {
                        let _ = std::fs::remove_dir(&out_root);
                    }
                    return EXIT_INVALID;
                }
            },
            None => None,
        };
        let llm_cache = trellis_engine::llm::LlmCache::new(
            args.llm_cache
                .clone()
                .unwrap_or_else(|| out_root.join(".llm-cache")),
            super::run::cache_mode(args.llm_cache_mode),
        );
        // A given address is listened on from the start, and one that cannot be is a usage
        // error, as for `trellis run`; without it the first rerun with a `spans #true`
        // agent starts a receiver on a free port.
        let receiver = match args.otlp_receiver {
            Some(addr) => match super::run::start_span_receiver(addr, true).await {
                Ok(receiver) => Some(Arc::new(receiver)),
                Err(e) => {
                    errln!("error: {e}");
                    return EXIT_INVALID;
                }
            },
            None => None,
        };
        let out_root_made = out_root.clone();
        let asks = asks_from_stdin();
        let keys = asks.is_some() && std::io::stdin().is_terminal();
        let mut session = Session {
            _claim: claim,
            args,
            roots,
            out_root,
            watcher,
            changes,
            asks,
            keys,
            warnings: Vec::new(),
            warnings_said: Vec::new(),
            pending: Vec::new(),
            pending_since: None,
            recursive: BTreeSet::new(),
            root_dirs: BTreeSet::new(),
            watched: BTreeSet::new(),
            known: BTreeSet::new(),
            load_cache: trellis_dsl::LoadCache::default(),
            memo: Arc::new(TurnMemo::new()),
            transport: HttpTransport::new(),
            launcher: Arc::new(super::launcher().keep_running()),
            llm_cache,
            receiver,
            planned: BTreeSet::new(),
            last: None,
            salts: HashMap::new(),
            gone: BTreeMap::new(),
            results: HashMap::new(),
            generations: HashMap::new(),
            complete: false,
            broken: false,
            since_finished: BTreeSet::new(),
            reruns: 0,
            tty: std::io::stdout().is_terminal(),
            server,
            made: [
                made[0].then_some(out_root_made),
                made[1].then(|| latest.clone()),
            ],
            rerun_dir: None,
        };
        for root in session.roots.clone() {
            session.watch_root(&root);
        }
        let code = session.run_forever().await;
        let made = std::mem::take(&mut session.made);
        // The lock goes with the session; a directory left empty then was only its.
        drop(session);
        for dir in made.iter().rev().flatten() {
            let _ = std::fs::remove_dir(dir);
        }
        code
    }

    /// Watches `root`: a directory with everything below it, a file through its directory
    /// (so a save by rename is seen).
    fn watch_root(&mut self, root: &Path) {
        let path = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        if path.is_dir() {
            self.watch_dir(&path, RecursiveMode::Recursive);
            // Its parent, for its own removal and return.
            if let Some(parent) = path.parent() {
                self.watch_dir(parent, RecursiveMode::NonRecursive);
            }
            self.root_dirs.insert(path);
        } else if let Some(parent) = path.parent() {
            self.watch_dir(parent, RecursiveMode::NonRecursive);
        }
    }

    fn watch_dir(&mut self, dir: &Path, mode: RecursiveMode) {
        if self.recursive.iter().any(|r| dir.starts_with(r))
            || (mode == RecursiveMode::NonRecursive && self.watched.contains(dir))
        {
            return;
        }
        match self.watcher.watch(dir, mode) {
            Ok(()) => {
                if mode == RecursiveMode::Recursive {
                    self.recursive.insert(dir.to_path_buf());
                } else {
                    self.watched.insert(dir.to_path_buf());
                }
            }
            Err(e) => errln!("warning: cannot watch {}: {e}", dir.display()),
        }
    }

    async fn run_forever(&mut self) -> u8 {
        let mut signals = Signals::watch();
        let mut next = Some(Changed {
            paths: Vec::new(),
            at: Instant::now(),
            afresh: false,
        });
        let mut asks = self.asks.take();
        loop {
            // Standard input ended (Ctrl-D): Enter asks for nothing any more, and the
            // footers stop saying it does.
            if asks.is_none() {
                self.keys = false;
            }
            let changed = match next.take() {
                Some(changed) => changed,
                None => tokio::select! {
                    changed = self.next_change() => match changed {
                        Some(changed) => changed,
                        None => return EXIT_STOPPED,
                    },
                    () = next_ask(&mut asks) => Changed {
                        paths: Vec::new(),
                        at: Instant::now(),
                        afresh: true,
                    },
                    _ = signals.next() => {
                        if self.last.is_some() {
                            errln!(
                                "stopped; the last results stay in {}",
                                self.latest_dir().display()
                            );
                        } else {
                            errln!("stopped; no rerun had finished, so there are no results");
                        }
                        return EXIT_STOPPED;
                    }
                },
            };
            match self.rerun(changed, &mut signals).await {
                Rerun::Done => {}
                Rerun::Superseded(changed) => next = Some(changed),
                Rerun::Stopped => {
                    // As `trellis run` says it: the session ends, and what the cut rerun
                    // finished is recorded in its own directory, marked as stopped.
                    let cut = match &self.rerun_dir {
                        Some(dir) => format!("{} (marked stopped)", dir.display()),
                        None => "its directory (marked stopped)".to_owned(),
                    };
                    if self.last.is_some() {
                        errln!(
                            "stopped during a rerun; what it finished is in {cut}, and the \
                             last finished rerun stays in {}",
                            self.latest_dir().display()
                        );
                    } else {
                        errln!("stopped during the first rerun; what it finished is in {cut}");
                    }
                    return EXIT_STOPPED;
                }
            }
        }
    }

    /// The next relevant change, once the files have been quiet for [`DEBOUNCE`].
    /// Cancel-safe: a change taken in before the caller stopped waiting (a rerun that
    /// ended meanwhile) stays in `self.pending` for the next call.
    async fn next_change(&mut self) -> Option<Changed> {
        loop {
            if self.pending.is_empty() {
                let first = self.changes.recv().await?;
                self.pending_since = Some(Instant::now());
                self.pending.extend(first);
            }
            loop {
                match tokio::time::timeout(DEBOUNCE, self.changes.recv()).await {
                    Ok(Some(more)) => self.pending.extend(more),
                    Ok(None) => return None,
                    Err(_) => break,
                }
            }
            let mut paths = std::mem::take(&mut self.pending);
            let at = self.pending_since.take().unwrap_or_else(Instant::now);
            // A root directory that was removed and is back: its old watch went with it.
            let back: Vec<PathBuf> = self
                .root_dirs
                .iter()
                .filter(|root| paths.contains(root) && root.is_dir())
                .cloned()
                .collect();
            for root in &back {
                // The old watch may still be registered (a rename away and back).
                let _ = self.watcher.unwatch(root);
                self.recursive.remove(root);
                self.watch_dir(root, RecursiveMode::Recursive);
            }
            // A directory back after it was removed (an include's directory outside the
            // roots: its old watch went with it), or one made, moved or copied into a root
            // that holds suite files: what it holds may load now. Any other new directory
            // (the reruns' own under `--out`, `.git`'s, a build's) changes nothing.
            let out = std::fs::canonicalize(&self.out_root).ok();
            let dirs: Vec<PathBuf> = paths
                .iter()
                .filter(|p| !self.root_dirs.contains(*p) && p.is_dir())
                .filter(|p| out.as_ref().is_none_or(|out| !p.starts_with(out)))
                .filter(|p| {
                    self.watched.contains(*p)
                        || (self.recursive.iter().any(|r| p.starts_with(r)) && holds_suite_files(p))
                })
                .cloned()
                .collect();
            for dir in &dirs {
                // Below a recursive root the watcher watches new directories itself.
                if self.watched.contains(dir) {
                    let _ = self.watcher.unwatch(dir);
                    if let Err(e) = self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                        errln!("warning: cannot watch {}: {e}", dir.display());
                    }
                }
            }
            // A root directory gone or back changes what loads, either way. So does a
            // directory that held loaded files and is gone: moved out of a watched one, it
            // is reported once, by its own name (its files are not removed, so they say
            // nothing), where `rm -r` reports every file.
            paths.retain(|p| {
                self.relevant(p)
                    || self.root_dirs.contains(p)
                    || dirs.contains(p)
                    || (!p.exists() && self.held_known(p))
            });
            if !paths.is_empty() {
                paths.sort();
                paths.dedup();
                return Some(Changed {
                    paths,
                    at,
                    afresh: false,
                });
            }
        }
    }

    /// Whether `dir` held a loaded file. A range lookup, not a walk of `known`: `rm -r` of a
    /// big directory is one event per file, and each of them asks.
    fn held_known(&self, dir: &Path) -> bool {
        self.known
            .range::<Path, _>((Bound::Included(dir), Bound::Unbounded))
            .next()
            .is_some_and(|k| k.starts_with(dir))
    }

    /// A file the project loaded, or any suite file (a new include, a new suite), but not an
    /// editor's lock on one (Emacs makes it at the first keystroke after a save).
    fn relevant(&self, path: &Path) -> bool {
        (path.extension().is_some_and(|e| e == "kdl") && !trellis_dsl::parse::editor_lock(path))
            || self.known.contains(path)
    }

    async fn rerun(&mut self, changed: Changed, signals: &mut Signals) -> Rerun {
        // Diagnostics are about this save; a rerun is about every save since the last
        // finished one.
        let what = if changed.afresh {
            ASKED.to_owned()
        } else {
            describe(&changed.paths)
        };
        self.since_finished.extend(changed.paths.iter().cloned());
        let project = match trellis_dsl::load_cached(
            &self.roots,
            &trellis_engine::protocol::registry::specs(),
            Default::default(),
            &mut self.load_cache,
        ) {
            Ok(project) => project,
            Err(diagnostics) => {
                self.broken = true;
                let said = format!("{:?}", miette::Report::new(diagnostics));
                self.show_invalid(&said);
                errln!("{said}");
                errln!(
                    "watch: {what}: the suite is invalid (see above); {}; fix it and save",
                    self.kept()
                );
                return Rerun::Done;
            }
        };
        // Suite files, and the dataset and history files they read: editing a row reruns
        // that row's instance.
        let read =
            project
                .datasets
                .iter()
                .map(|d| &d.resolved)
                .chain(project.scenarios().filter_map(|(_, sc)| {
                    match sc.history.as_deref().map(|h| &h.source) {
                        Some(trellis_dsl::HistorySource::File { resolved, .. }) => Some(resolved),
                        _ => None,
                    }
                }));
        let paths: BTreeSet<&PathBuf> = project.files.iter().map(|f| &f.path).chain(read).collect();
        // What this load read, not every file any load did: a file dropped from the suite
        // no longer matters, and the set does not grow over a long session.
        self.known.clear();
        for file in paths {
            let path = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
            if let Some(dir) = path.parent() {
                let dir = dir.to_path_buf();
                self.watch_dir(&dir, RecursiveMode::NonRecursive);
                // Its parent too, for the directory's own removal and return (`rm -r` of an
                // included directory, then putting it back).
                if let Some(parent) = dir.parent() {
                    self.watch_dir(parent, RecursiveMode::NonRecursive);
                }
            }
            self.known.insert(path);
        }
        let plan = match Plan::build(&project, &self.args.select.selection()) {
            Ok(plan) => plan,
            Err(e) => {
                self.broken = true;
                let said = format!("{:?}", miette::Report::new(e));
                self.show_invalid(&said);
                errln!("{said}");
                errln!(
                    "watch: {what}: the suite cannot be planned; {}",
                    self.kept()
                );
                return Rerun::Done;
            }
        };
        if plan.scenarios.is_empty() {
            self.broken = true;
            let said = super::nothing_selected(&project, &self.args.select.selection());
            self.show_invalid(&said);
            errln!("watch: {what}: {said}");
            return Rerun::Done;
        }
        self.warnings = super::project_warnings(&project)
            .into_iter()
            .map(|w| format!("{:?}", miette::Report::new(w)))
            .collect();
        if !self.tty && self.warnings != self.warnings_said {
            self.say_warnings();
        }
        let prints = fingerprint::project(&project);
        // Scenarios whose only change may be what a tool answers: which of them called an
        // edited tool, asked of the memo once. A scenario back from `gone` keeps its turns
        // under the salt it left with.
        let now: HashMap<&str, (u64, &trellis_engine::sandbox::SandboxSpec)> = plan
            .scenarios
            .iter()
            .filter_map(|s| {
                let key = format!("{}/{}", s.suite, s.scenario.id.value);
                let (now, last) = (prints.get(&key)?, self.previous(&key)?);
                if now.setup == last.setup || now.salt != last.salt {
                    return None;
                }
                let salt = self
                    .salts
                    .get(&key)
                    .copied()
                    .or_else(|| self.gone.get(&key).map(|g| g.salt))?;
                let (key, _) = prints.get_key_value(&key)?;
                Some((key.as_str(), (salt, &*s.sandbox)))
            })
            .collect();
        let changed_tools = self.memo.calls_changed_tools(&now);
        let (mut whys, mut first) = self.reasons(&plan, &prints, &|key| {
            !now.contains_key(key) || changed_tools.contains(key)
        });
        if changed.afresh {
            // The agent itself may have changed, which no file of the suites says: nothing
            // recorded before is reused.
            for (key, why) in whys.iter_mut() {
                if *why != Why::New {
                    *why = Why::Asked;
                }
                *self.generations.entry(key.clone()).or_default() += 1;
            }
            first = (0..plan.scenarios.len()).collect();
        }
        // A scenario gone from the suite (or the selection) changes the results too.
        let removed: Vec<String> = self
            .planned
            .iter()
            .filter(|key| !whys.contains_key(*key))
            .cloned()
            .collect();
        let changed_any = !removed.is_empty() || whys.values().any(|w| *w != Why::Unchanged);
        let was_broken = std::mem::replace(&mut self.broken, false);
        if !changed_any && self.complete {
            if was_broken {
                outln!("watch: {what}: valid again; nothing changed since the last run");
                if let Some(server) = &self.server {
                    server.invalid(None);
                }
            }
            // The suites are as the last finished rerun left them: those saves are covered.
            self.since_finished.clear();
            return Rerun::Done;
        }
        for (key, why) in &whys {
            if matches!(why, Why::Dependency | Why::BackAfterNeeds) {
                *self.generations.entry(key.clone()).or_default() += 1;
            }
        }
        let salts: HashMap<String, u64> = whys
            .keys()
            .filter_map(|key| {
                let setup = prints.get(key)?.salt;
                let mut h = DefaultHasher::new();
                (setup, self.generations.get(key).copied().unwrap_or(0)).hash(&mut h);
                Some((key.clone(), h.finish()))
            })
            .collect();
        // The memo keeps the turns of a scenario that did not run only under the salt it
        // is given: those going now and those gone before keep theirs, for their return.
        let mut memo_salts = salts.clone();
        let going = removed
            .iter()
            .filter_map(|key| Some((key, *self.salts.get(key)?)));
        let gone = self.gone.iter().map(|(key, gone)| (key, gone.salt));
        for (key, salt) in going.chain(gone) {
            memo_salts.entry(key.clone()).or_insert(salt);
        }
        let trajectory_whys = self.trajectory_reasons(&plan, &prints, &whys);
        let planned: BTreeSet<String> = whys.keys().cloned().collect();
        let dropped = dropped_repetitions(&plan, &whys, &self.results);
        self.reruns += 1;
        let header = RunHeader {
            number: self.reruns,
            what: if changed.afresh && self.since_finished.is_empty() {
                ASKED.to_owned()
            } else {
                describe(&self.since_finished.iter().cloned().collect::<Vec<_>>())
            },
            changed_at: changed.at,
            whys: whys.clone(),
            removed,
            dropped,
            sites: super::sites::Sites::of(&plan, &project),
            needs_changed: needs_changed(&plan, &whys),
        };
        let outcome = self
            .execute(plan, memo_salts, header, trajectory_whys, first, signals)
            .await;
        match outcome {
            Executed::Finished => {
                self.forget_gone(&planned);
                self.salts = salts;
                self.planned = planned;
                self.last = Some(prints);
                self.complete = true;
                self.since_finished.clear();
                Rerun::Done
            }
            Executed::Superseded(changed) => {
                // What did run is in the memo; the next run redoes the rest, and says why
                // against the last run that finished.
                self.complete = false;
                Rerun::Superseded(changed)
            }
            Executed::Stopped => Rerun::Stopped,
        }
    }

    /// What `key` was when last planned: in the last finished run, or before it went.
    /// The last run's fingerprints cover every scenario of the suites, but one it did not
    /// plan (out of the selection) is not in its results, nor are its turns kept.
    fn previous(&self, key: &str) -> Option<&ScenarioFingerprints> {
        if self.planned.contains(key) {
            self.last.as_ref().and_then(|last| last.get(key))
        } else {
            self.gone.get(key).map(|gone| &gone.prints)
        }
    }

    /// After a finished run that planned `planned`: the scenarios it dropped are
    /// remembered, those it planned again are no longer gone, and the oldest gone are
    /// forgotten beyond [`GONE_KEPT`] (the next finished run drops their turns).
    fn forget_gone(&mut self, planned: &BTreeSet<String>) {
        self.gone.retain(|key, _| !planned.contains(key));
        for key in self.planned.difference(planned) {
            let prints = self.last.as_ref().and_then(|last| last.get(key));
            if let (Some(prints), Some(&salt)) = (prints, self.salts.get(key)) {
                let gone = Gone {
                    prints: prints.clone(),
                    salt,
                    rerun: self.reruns,
                };
                self.gone.insert(key.clone(), gone);
            }
        }
        if self.gone.len() > GONE_KEPT {
            let mut oldest: Vec<(u64, String)> = self
                .gone
                .iter()
                .map(|(key, gone)| (gone.rerun, key.clone()))
                .collect();
            oldest.sort_unstable();
            let excess = self.gone.len() - GONE_KEPT;
            for (_, key) in oldest.into_iter().take(excess) {
                self.gone.remove(&key);
            }
        }
    }

    /// Why each planned scenario reruns, compared with the last run; and the plan indices of
    /// those that do (not [`Why::Unchanged`]), which start first: their results are what the
    /// person waits for.
    /// `calls_changed_tools(key)`: whether scenario `key` has a recorded turn that called a
    /// tool whose answers changed (or no recorded turn at all).
    fn reasons(
        &self,
        plan: &Plan,
        prints: &BTreeMap<String, ScenarioFingerprints>,
        calls_changed_tools: &dyn Fn(&str) -> bool,
    ) -> (BTreeMap<String, Why>, Vec<usize>) {
        let keys: Vec<String> = plan
            .scenarios
            .iter()
            .map(|s| format!("{}/{}", s.suite, s.scenario.id.value))
            .collect();
        // Scenarios a trajectory of which could not reach its agent last time.
        let unreached: HashSet<String> = self
            .results
            .iter()
            .filter(|(_, standing)| standing.unreached)
            .map(|((suite, scenario, ..), _)| format!("{suite}/{scenario}"))
            .collect();
        let mut whys: Vec<Why> = keys
            .iter()
            .zip(&plan.scenarios)
            .map(|(key, s)| {
                let (Some(last), Some(now)) = (self.previous(key), prints.get(key)) else {
                    return Why::New;
                };
                let back = !self.planned.contains(key);
                // Whatever else changed in it: none of its recorded turns can be trusted.
                if back && !s.needs.is_empty() {
                    return Why::BackAfterNeeds;
                }
                let mocks = now.setup != last.setup;
                if mocks && now.salt == last.salt && calls_changed_tools(key) {
                    return Why::Mocks;
                }
                // What changed besides what tools answer: an edited mock none of its turns
                // called changes nothing of it.
                match now.salted_scenario.change_from(&last.salted_scenario) {
                    Change::Conversation if now.salt != last.salt => Why::Setup,
                    // Every node sends and checks what it did: the conversation half moved
                    // by `repeat` alone (it counts there, not in any node).
                    Change::Conversation if now.salted_nodes == last.salted_nodes => Why::Repeat,
                    Change::Conversation => Why::Steps,
                    Change::Checks => Why::Checks,
                    // Unchanged, but not in the last results: it must be added to them.
                    Change::None if back => Why::Back,
                    Change::None if unreached.contains(key.as_str()) => Why::Unreached,
                    Change::None => Why::Unchanged,
                }
            })
            .collect();
        // A scenario whose dependency talked to the agent again talks to it afresh too,
        // and so on down the `needs` chain: followed from each such scenario to those that
        // need it. (Passes over every scenario until none changed took one pass per link
        // of a chain written against the plan's order: 8,000 scenarios each needing the
        // next, 0.3 s.)
        if plan.scenarios.iter().any(|s| !s.needs.is_empty()) {
            let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); plan.scenarios.len()];
            for (i, s) in plan.scenarios.iter().enumerate() {
                for &need in &s.needs {
                    if let Some(of_need) = dependents.get_mut(need) {
                        of_need.push(i);
                    }
                }
            }
            // One whose agent is asked again may pass now: what needs it (skipped for it)
            // runs again too.
            let mut afresh: Vec<usize> = (0..whys.len())
                .filter(|&i| whys[i].moves_dependants())
                .collect();
            while let Some(i) = afresh.pop() {
                for &dependent in &dependents[i] {
                    // Its own steps edited too: its unchanged prefix was answered by an
                    // agent in the state the dependency left it in then, so it talks
                    // afresh from the first turn, not from the first edited step.
                    if whys[dependent] < Why::Dependency || whys[dependent] == Why::Steps {
                        whys[dependent] = Why::Dependency;
                        afresh.push(dependent);
                    }
                }
            }
        }
        let rerun = (0..whys.len())
            .filter(|&i| whys[i] != Why::Unchanged)
            .collect();
        (keys.into_iter().zip(whys).collect(), rerun)
    }

    /// Why each trajectory reruns: within a scenario whose steps changed, only those
    /// through a changed node.
    fn trajectory_reasons(
        &self,
        plan: &Plan,
        prints: &BTreeMap<String, ScenarioFingerprints>,
        whys: &BTreeMap<String, Why>,
    ) -> HashMap<(String, String), Why> {
        let mut out = HashMap::new();
        for s in &plan.scenarios {
            let key = format!("{}/{}", s.suite, s.scenario.id.value);
            let why = whys.get(&key).copied().unwrap_or(Why::New);
            let last = self.previous(&key);
            let now = prints.get(&key);
            // A scenario gone from the last run and back with some steps edited: its
            // trajectories through none of them are answered from the records, as a
            // scenario back unchanged is, and are "back", not "new" (the last results do
            // not hold them).
            let back = !self.planned.contains(&key);
            for t in &s.trajectories {
                let leaf = t.nodes.last();
                let node_why = match (why, last, now, leaf) {
                    (Why::Steps | Why::Checks | Why::Repeat, Some(last), Some(now), Some(leaf)) => {
                        match (last.salted_nodes.get(leaf), now.salted_nodes.get(leaf)) {
                            (Some(before), Some(after)) => {
                                // A node's fingerprint chains its parents': the leaf's says
                                // whether anything on the path changed. The scenario's own
                                // criteria are in every node's checks.
                                match after.change_from(before) {
                                    Change::Conversation => Why::Steps,
                                    Change::Checks => Why::Checks,
                                    Change::None if back => Why::Back,
                                    Change::None => Why::Unchanged,
                                }
                            }
                            _ => Why::Steps,
                        }
                    }
                    (why, ..) => why,
                };
                out.insert((key.clone(), t.name.clone()), node_why);
            }
        }
        out
    }

    /// The session's span receiver: the one `--otlp-receiver` asked for, or, when `plan` has
    /// a `spans #true` agent (as `trellis run` starts one), one on a free loopback port,
    /// started the first time. One that cannot listen is a warning: the rerun goes on
    /// without spans, as a run without a receiver does.
    async fn span_receiver(
        &mut self,
        plan: &Plan,
    ) -> Option<Arc<trellis_engine::otel::SpanReceiver>> {
        if self.args.otlp_receiver.is_some() {
            return self.receiver.clone();
        }
        if !plan.agents.iter().any(|a| a.spans) {
            return None;
        }
        if self.receiver.is_none() {
            let any_port = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            let tell = super::run::own_agents_send_spans(plan);
            match super::run::start_span_receiver(any_port, tell).await {
                Ok(receiver) => self.receiver = Some(Arc::new(receiver)),
                Err(e) => errln!("warning: no agent spans are collected: {e}"),
            }
        }
        self.receiver.clone()
    }

    async fn execute(
        &mut self,
        plan: Plan,
        salts: HashMap<String, u64>,
        header: RunHeader,
        trajectory_whys: HashMap<(String, String), Why>,
        first: Vec<usize>,
        signals: &mut Signals,
    ) -> Executed {
        // `STAMP-rNNNN-SALT`: the session's reruns sort in order even within one second.
        let run_id = match new_run_id().split_once('-') {
            Some((stamp, salt)) => format!("{stamp}-r{:04}-{salt}", header.number),
            None => format!("{}-r{:04}", new_run_id(), header.number),
        };
        let out = self.out_root.join(&run_id);
        self.rerun_dir = Some(out.clone());
        let rerun = match Record::create(&out) {
            Ok(record) => record,
            Err(e) => {
                errln!("error: cannot record the rerun in {}: {e}", out.display());
                return Executed::Finished;
            }
        };
        // Marked, so `trellis runs`, `compare` and trends never take it for a whole run.
        if let Err(e) = trellis_reports::history::mark_watch_rerun(&out, &run_id, header.number) {
            errln!("warning: {e}: {}", source(&e));
        }
        let latest = match self.start_latest(&run_id) {
            Ok(record) => Some(record),
            Err(e) => {
                errln!(
                    "warning: cannot record {}: {e}",
                    self.latest_dir().display()
                );
                None
            }
        };
        let expected = expected_trajectories(&plan, &trajectory_whys);
        self.memo.begin_run(salts);
        if self.tty {
            // The view is redrawn in place: each rerun replaces the last one's screen.
            super::console::out_text("\x1b[2J\x1b[H");
        }
        header.print(&trajectory_whys);
        let view = View {
            header,
            whys: trajectory_whys,
            previous: std::mem::take(&mut self.results),
            results: HashMap::new(),
            shown: HashSet::new(),
            first_result: None,
        };
        let receiver = self.span_receiver(&plan).await;
        let telemetry = trellis_engine::otel::Telemetry {
            notices: receiver
                .as_ref()
                .map(|r| super::console::spans_notices(r.endpoint())),
            receiver,
            receiver_given: self.args.otlp_receiver.is_some(),
            ..Default::default()
        };
        let options = RunOptions {
            run_id: run_id.clone(),
            // Said once, when the session starts.
            jobs: crate::descriptors::jobs_within_limit(
                self.args.jobs,
                crate::descriptors::AgentDescriptors::of(plan.agents.iter().map(|a| &a.endpoint)),
            )
            .0,
            stop: Default::default(),
            abandon: Default::default(),
            grace_end: Default::default(),
            strict: self.args.strict,
            reuse: Some(self.memo.clone()),
            transport: Some(self.transport.clone()),
            llm_cache: self.llm_cache.clone(),
            launcher: Some(self.launcher.clone()),
            resume: None,
            replay_users: None,
            first,
            llm_budget: Default::default(),
            telemetry,
        };
        let cancel = options.stop.clone();
        let abandon = options.abandon.clone();
        let (tx, rx) = event::channel();
        let recorder = Recorder {
            rerun,
            latest,
            view,
            expected,
            summary: None,
            recorded: RunSummary::default(),
            reused_roles: Default::default(),
            talked_in: HashSet::new(),
        };
        let reporter = std::thread::Builder::new()
            .name("trellis-watch-reporter".into())
            .spawn(move || recorder.consume(rx));
        let reporter = match reporter {
            Ok(handle) => handle,
            Err(e) => {
                errln!("error: cannot start the reporter thread: {e}");
                return Executed::Finished;
            }
        };
        let mut engine = execute::spawn(plan, options, tx);
        let mut ended = tokio::select! {
            _ = &mut engine => Executed::Finished,
            changed = self.next_change() => match changed {
                Some(changed) => Executed::Superseded(changed),
                None => Executed::Stopped,
            },
            _ = signals.next() => Executed::Stopped,
        };
        if !matches!(ended, Executed::Finished) {
            // Graceful first, as for `trellis run`: calls in flight may finish within the
            // grace period; a further signal cuts them off at once.
            cancel.cancel();
            let finished = tokio::select! {
                finished = tokio::time::timeout(CANCEL_GRACE, &mut engine) => finished.is_ok(),
                // A signal while a newer save stops this rerun ends the session, not only
                // the grace: the next rerun must not start.
                _ = signals.next() => {
                    ended = Executed::Stopped;
                    false
                }
            };
            if !finished {
                // The calls left are dropped and the rerun ends with what finished; an
                // engine that does not end soon after is aborted.
                abandon.cancel();
                if tokio::time::timeout(CANCEL_GRACE, &mut engine)
                    .await
                    .is_err()
                {
                    engine.abort();
                    let _ = engine.await;
                }
            }
        }
        let finished = tokio::task::spawn_blocking(move || reporter.join()).await;
        let Ok(Ok(recorded)) = finished else {
            errln!("error: trellis failed while recording the rerun (a bug)");
            self.memo.finish_run(false);
            return ended;
        };
        self.memo.finish_run(matches!(ended, Executed::Finished));
        let counts = self.memo.counts();
        let called: u64 = counts.values().map(|c| c.called).sum();
        let reused: u64 = counts.values().map(|c| c.reused).sum();
        let Recorded {
            view,
            summary,
            report_html,
        } = recorded;
        let View {
            header,
            mut previous,
            results,
            shown,
            first_result,
            ..
        } = view;
        if matches!(ended, Executed::Finished) {
            // A finished rerun has every selected trajectory: anything else is gone.
            self.results = results;
        } else {
            previous.extend(results);
            self.results = previous;
        }
        // The whole state replaces `latest/` only once it is whole: a rerun a newer save
        // or a signal stopped leaves the last finished one there.
        let report_html = match &ended {
            Executed::Finished => match promote_latest(&self.staging_dir(), &self.latest_dir()) {
                Ok(()) => report_html.map(|_| self.latest_dir().join("report.html")),
                Err(why) => {
                    errln!(
                        "warning: {why}: {} keeps the rerun before",
                        self.latest_dir().display()
                    );
                    None
                }
            },
            _ => {
                if let Err(why) = discard_staging(&self.staging_dir()) {
                    errln!("warning: {why}");
                }
                None
            }
        };
        match &ended {
            Executed::Finished => {
                header.finish(summary.as_ref(), called, reused, &out, first_result);
                if self.tty {
                    // The screen was redrawn: failures that did not rerun stay in sight.
                    print_standing_failures(&self.results, &shown, &self.latest_dir());
                    self.say_warnings();
                    if self.keys {
                        outln!(
                            "watch: Enter reruns every scenario afresh (after changing an agent)"
                        );
                    }
                    // The line that said it at the start was cleared with the screen.
                    if let Some(server) = &self.server {
                        outln!("watch: the latest report is served on {}", server.url());
                    }
                }
                if let (Some(server), Some(html)) = (&self.server, report_html) {
                    server.publish(html);
                }
            }
            Executed::Superseded(_) => outln!(
                // What comes next is the newer save's: a rerun, or its errors.
                "watch: rerun {} stopped by a newer save ({} made)",
                header.number,
                super::console::count(called, "agent call", "agent calls")
            ),
            Executed::Stopped => {}
        }
        if let Executed::Superseded(changed) = &mut ended {
            changed.paths.sort();
        }
        ended
    }
}

impl Session {
    /// Prints what `trellis check` warns of in the suites, the first few in full.
    fn say_warnings(&mut self) {
        const SHOWN: usize = 5;
        for warning in self.warnings.iter().take(SHOWN) {
            errln!("{warning}");
        }
        match self.warnings.len() {
            0 if !self.warnings_said.is_empty() => {
                errln!("watch: the suites' warnings are all gone");
            }
            0 => {}
            n if n > SHOWN => errln!(
                "watch: {n} warnings in the suites, {} more than shown: `trellis check` lists them",
                n - SHOWN
            ),
            n => errln!(
                "watch: {} in the suites (as `trellis check` gives them)",
                super::console::count(n as u64, "warning", "warnings")
            ),
        }
        self.warnings_said = self.warnings.clone();
    }

    /// Tells an open `--serve` tab that the suites do not load, with what the console
    /// printed (its colours taken out).
    fn show_invalid(&self, said: &str) {
        if let Some(server) = &self.server {
            server.invalid(Some(anstream::adapter::strip_str(said).to_string()));
        }
    }

    /// What a save that cannot run leaves: the last finished rerun's results, or none yet
    /// (a session that started on a broken suite).
    fn kept(&self) -> &'static str {
        if self.last.is_some() {
            "the last results stay"
        } else {
            "nothing has run yet"
        }
    }

    /// `--out/latest`: the whole state after the last rerun.
    fn latest_dir(&self) -> PathBuf {
        self.out_root.join(LATEST)
    }

    /// Where a rerun records the whole state until it finishes: `latest/` keeps the last
    /// finished rerun's results meanwhile (a slow rerun cleared them at its start, so a tab
    /// opened or reloaded then found no report, and a rerun stopped by Ctrl-C left
    /// `latest/` with only what it had finished).
    fn staging_dir(&self) -> PathBuf {
        self.out_root.join(LATEST_STAGING)
    }

    /// Starts recording rerun `run_id`'s whole state, marked so its tables say what it is
    /// (`runs.parquet`'s `kind`), into the staging directory [`promote_latest`] moves into
    /// `latest/` once the rerun finishes.
    fn start_latest(&self, run_id: &str) -> Result<Record, String> {
        let dir = self.staging_dir();
        // What a rerun killed before it finished left behind.
        discard_staging(&dir)?;
        let record = Record::create(&dir)?;
        trellis_reports::history::mark_watch_latest(&dir, run_id)
            .map_err(|e| format!("{e}: {}", source(&e)))?;
        Ok(record)
    }
}

/// Under the runs directory, beside `latest/`: a finished rerun's recording before it
/// replaces `latest/`'s (hidden, marked as watch's: never listed as a run).
const LATEST_STAGING: &str = ".latest.next";

/// Removes a staging directory and all it holds, if there is one.
fn discard_staging(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}

/// Moves a finished rerun's recording from `staging` into `latest`, each file renamed over
/// the last rerun's, so that `latest/` always holds one whole rerun's report; results the
/// new recording lacks are removed first. `latest/`'s lock (the session's hold) stays.
fn promote_latest(staging: &Path, latest: &Path) -> Result<(), String> {
    let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(staging)
        .and_then(|dir| dir.collect())
        .map_err(|e| format!("cannot read {}: {e}", staging.display()))?;
    let names: HashSet<std::ffi::OsString> = entries.iter().map(|e| e.file_name()).collect();
    for name in trellis_reports::RESULT_FILES {
        if !names.contains(std::ffi::OsStr::new(name)) {
            match std::fs::remove_file(latest.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!(
                        "cannot remove {}: {e}",
                        latest.join(name).display()
                    ));
                }
            }
        }
    }
    for entry in entries {
        let to = latest.join(entry.file_name());
        std::fs::rename(entry.path(), &to).map_err(|e| {
            format!(
                "cannot move {} to {}: {e}",
                entry.path().display(),
                to.display()
            )
        })?;
    }
    discard_staging(staging)
}

/// Trajectory runs (× agents × repetitions) of the plan that rerun.
fn expected_trajectories(plan: &Plan, whys: &HashMap<(String, String), Why>) -> u64 {
    plan.scenarios
        .iter()
        .map(|s| {
            let key = format!("{}/{}", s.suite, s.scenario.id.value);
            let rerun = s
                .trajectories
                .iter()
                .filter(|t| {
                    whys.get(&(key.clone(), t.name.clone()))
                        .is_none_or(|w| *w != Why::Unchanged)
                })
                .count() as u64;
            rerun * s.agents.len() as u64 * u64::from(s.repeat)
        })
        .sum()
}

enum Rerun {
    Done,
    Superseded(Changed),
    Stopped,
}

enum Executed {
    Finished,
    Superseded(Changed),
    Stopped,
}

/// What a rerun is about, printed before its results.
struct RunHeader {
    number: u64,
    what: String,
    changed_at: Instant,
    whys: BTreeMap<String, Why>,
    /// Scenarios the last run had and this one does not.
    removed: Vec<String>,
    /// Repetitions of a scenario the last run had and a lowered `repeat` takes away.
    dropped: BTreeMap<String, BTreeSet<u32>>,
    /// Where this rerun's suites write each check, said after each failed one.
    sites: super::sites::Sites,
    /// For each scenario rerun because of what it `needs`: those of its needs that rerun.
    needs_changed: HashMap<String, Vec<String>>,
}

impl RunHeader {
    fn print(&self, trajectories: &HashMap<(String, String), Why>) {
        // Each scenario's trajectories counted, and those that rerun named, in one pass:
        // looked up among all trajectories for each scenario, a save that changed all of
        // 20,000 scenarios took eight seconds to say so.
        let mut by_scenario: HashMap<&str, (usize, Vec<&str>)> = HashMap::new();
        for ((key, trajectory), why) in trajectories {
            let (total, branches) = by_scenario.entry(key).or_default();
            *total += 1;
            if *why != Why::Unchanged {
                branches.push(trajectory);
            }
        }
        let rerun: Vec<String> = self
            .whys
            .iter()
            .filter(|(_, why)| **why != Why::Unchanged)
            .map(|(key, why)| {
                let (total, branches) = by_scenario
                    .get_mut(key.as_str())
                    .map_or((0, Vec::new()), |(total, branches)| {
                        (*total, std::mem::take(branches))
                    });
                if branches.len() < total && !branches.is_empty() {
                    let mut branches = branches;
                    branches.sort_unstable();
                    format!("{key} ({}: {})", why.label(), branches.join(", "))
                } else if let Some(needs) = self.needs_changed.get(key) {
                    format!("{key} ({}: {})", why.label(), needs.join(", "))
                } else {
                    format!("{key} ({})", why.label())
                }
            })
            .collect();
        let unchanged = self.whys.len() - rerun.len();
        outln!(
            "watch: rerun {}: {}: {} to rerun{}",
            self.number,
            self.what,
            super::console::count(rerun.len() as u64, "scenario", "scenarios"),
            if unchanged > 0 {
                format!(", {unchanged} unchanged")
            } else {
                String::new()
            }
        );
        for line in rerun {
            outln!("  rerun {line}");
        }
        for key in &self.removed {
            outln!("  removed {key}");
        }
        for (key, repetitions) in &self.dropped {
            // Numbered as everywhere else, from 0.
            let numbers: Vec<String> = repetitions.iter().map(|r| format!("#{r}")).collect();
            outln!(
                "  removed {key} {} {}",
                if numbers.len() == 1 {
                    "repetition"
                } else {
                    "repetitions"
                },
                numbers.join(", ")
            );
        }
    }

    fn finish(
        &self,
        summary: Option<&RunSummary>,
        called: u64,
        reused: u64,
        out: &Path,
        first_result: Option<Duration>,
    ) {
        let took = self.changed_at.elapsed();
        let first = first_result
            .map(|d| format!(", first result after {} ms", d.as_millis()))
            .unwrap_or_default();
        match summary {
            Some(s) => outln!(
                "watch: rerun {} done in {} ms{first}: {}: {} passed, {} failed, {}, {} \
                 skipped; {}, {} reused; {}",
                self.number,
                took.as_millis(),
                super::console::count(s.trajectories, "trajectory", "trajectories"),
                s.passed,
                s.failed,
                super::console::count(s.errors, "error", "errors"),
                s.skipped,
                super::console::count(called, "agent call", "agent calls"),
                super::console::count(reused, "turn", "turns"),
                out.display()
            ),
            None => outln!(
                "watch: rerun {} ended without a summary; {}; {}",
                self.number,
                super::console::count(called, "agent call", "agent calls"),
                out.display()
            ),
        }
        for (address, n) in summary.iter().flat_map(|s| &s.connections_redone) {
            outln!("  {}", super::console::backlog_notice(address, *n));
        }
        for (command, n) in summary.iter().flat_map(|s| &s.requests_resent) {
            outln!("  {}", super::console::resent_notice(command, *n));
        }
    }
}

/// Suite, scenario, trajectory, agent, repetition.
type ResultKey = (String, String, String, String, u32);

/// A trajectory's last result, as the view remembers it.
#[derive(Clone, Debug)]
struct Standing {
    status: TrajectoryStatus,
    /// The first failed check or the fault, for failures.
    why: Option<String>,
    /// Its fault says the agent could not be reached at all ([`execute::unreachable`]: such
    /// a turn is asked again, not reused).
    unreached: bool,
}

impl Standing {
    fn of(t: &TrajectoryRecord, sites: &super::sites::Sites) -> Self {
        let why = t
            .fault
            .as_ref()
            .map(|f| {
                let message = super::console::untrusted(&f.message);
                format!("fault ({}): {message}", f.category.as_str())
            })
            .or_else(|| {
                t.criteria
                    .iter()
                    .find(|c| c.status == CriterionStatus::Failed)
                    .map(|c| {
                        let detail = super::console::untrusted(c.detail.as_deref().unwrap_or(""));
                        format!("{}{}: {detail}", c.criterion, sites.after_check(t, c))
                    })
            });
        let unreached = t.fault.as_ref().is_some_and(execute::unreachable);
        Standing {
            status: t.status,
            why,
            unreached,
        }
    }
}

/// Failed trajectories this rerun did not show (they did not rerun): one line each, for the
/// first [`STANDING_SHOWN`] in order, then how many more. The list ends a redrawn screen, so
/// that the failures stay in sight; thousands of them scrolled the rerun itself out of it.
fn print_standing_failures(
    results: &HashMap<ResultKey, Standing>,
    shown: &HashSet<ResultKey>,
    latest: &Path,
) {
    let mut standing: Vec<(&ResultKey, &Standing)> = results
        .iter()
        .filter(|(key, s)| {
            matches!(s.status, TrajectoryStatus::Failed | TrajectoryStatus::Error)
                && !shown.contains(*key)
        })
        .collect();
    if standing.is_empty() {
        return;
    }
    let more = standing.len().saturating_sub(STANDING_SHOWN);
    standing.sort_by(|a, b| a.0.cmp(b.0));
    standing.truncate(STANDING_SHOWN);
    outln!("still failing (unchanged):");
    for ((suite, scenario, trajectory, agent, repetition), s) in standing {
        outln!(
            "  {:<7} {suite}/{scenario} · {trajectory} [{agent} #{repetition}]  {}",
            s.status.as_str(),
            s.why.as_deref().unwrap_or("")
        );
    }
    if more > 0 {
        outln!(
            "  … and {more} more (in order, the first {STANDING_SHOWN} shown): see {}",
            latest.join("report.html").display()
        );
    }
}

/// The live view of one rerun: a line per trajectory that reran or whose result changed,
/// with the failed checks under it.
struct View {
    header: RunHeader,
    whys: HashMap<(String, String), Why>,
    previous: HashMap<ResultKey, Standing>,
    results: HashMap<ResultKey, Standing>,
    /// Trajectories this rerun printed a line for.
    shown: HashSet<ResultKey>,
    /// From the change to the first trajectory that reran.
    first_result: Option<Duration>,
}

impl View {
    /// Shows `t` if it reran or its result changed; returns whether it did.
    /// `talked`: the trajectory called an agent in this rerun (none of its turns reused).
    fn on_trajectory(&mut self, t: &TrajectoryRecord, talked: bool) -> bool {
        let scenario = format!("{}/{}", t.suite, t.scenario);
        // Continuations of agent-initiated forks carry `~label` suffixes.
        let base = t.trajectory.split('~').next().unwrap_or(&t.trajectory);
        let why = self
            .whys
            .get(&(scenario.clone(), base.to_owned()))
            .copied()
            .unwrap_or(Why::New);
        let key = (
            t.suite.clone(),
            t.scenario.clone(),
            t.trajectory.clone(),
            t.agent.clone(),
            t.repetition,
        );
        let before = self.previous.get(&key).map(|s| s.status);
        self.results
            .insert(key.clone(), Standing::of(t, &self.header.sites));
        if why == Why::Unchanged && before == Some(t.status) {
            return false;
        }
        // A trajectory of a scenario rerun for an edited mock that called no agent (none of
        // its turns called the tool) is recorded, as the rerun planned it, but not shown: on
        // the screen it is as unchanged as one of an unchanged scenario.
        if why == Why::Mocks && !talked && before == Some(t.status) {
            return true;
        }
        self.shown.insert(key);
        // Any result shown is the rerun's first result: a repetition `repeat` added is
        // shown as `new` though its trajectory is unchanged.
        if self.first_result.is_none() {
            self.first_result = Some(self.header.changed_at.elapsed());
        }
        let why = match (why, before) {
            // A new repetition, or one the last run did not finish.
            (Why::Unchanged, None) => "new",
            (Why::Unchanged, Some(_)) => "result changed",
            (why, _) => why.label(),
        };
        // Numbered as everywhere else (`run`, the report, Parquet `repetition`): from 0.
        outln!(
            "  {:<7} {scenario} · {} [{} #{}]  {:.0} ms  ({why})",
            t.status.as_str(),
            t.trajectory,
            t.agent,
            t.repetition,
            t.duration_ms
        );
        if let Some(fault) = &t.fault {
            outln!(
                "      fault ({}): {}",
                fault.category.as_str(),
                super::console::untrusted(&fault.message)
            );
        }
        // A check whose evaluator failed (a judge that could not be asked) is what made an
        // `error` trajectory without a fault: said under it, as `run` does.
        for c in t.criteria.iter().filter(|c| c.status.is_failure()) {
            let turn = c
                .turn_index
                .map(|i| format!("turn {i}: "))
                .unwrap_or_default();
            let what = if c.status == CriterionStatus::Error {
                "error"
            } else {
                "failed"
            };
            outln!(
                "      {what} {turn}{}{}: {}",
                c.criterion,
                self.header.sites.after_check(t, c),
                super::console::untrusted(c.detail.as_deref().unwrap_or(""))
            );
        }
        if let Some(reason) = &t.skip_reason {
            outln!("      skipped: {reason}");
        }
        true
    }
}

/// Finishes one recording of a rerun, warning about what could not be written; the path of
/// its `report.html` when it was written.
fn finish_record(record: Record) -> Option<PathBuf> {
    let out = record.out().to_path_buf();
    let recorded = record.finish();
    for problem in &recorded.problems {
        errln!(
            "warning: the results in {} are incomplete: {problem}",
            out.display()
        );
    }
    let html = out.join(trellis_reports::HTML_FILE);
    recorded
        .files
        .filter(|files| !files.is_missing(&html))
        .map(|_| html)
}

/// Consumes one rerun's events into two recordings and the view. The rerun's own directory
/// records what reran: the trajectories the view shows, and only the turns that called the
/// agent (a checks-only rerun has trajectories and no turns). `latest/` records the whole
/// state of the suites after the rerun, reused turns included (`reused: true`): what
/// `--serve` shows.
struct Recorder {
    rerun: Record,
    latest: Option<Record>,
    view: View,
    /// Trajectories the rerun is expected to record (those that rerun).
    expected: u64,
    summary: Option<RunSummary>,
    /// Tallies of what the rerun's directory records.
    recorded: RunSummary,
    /// The LLM calls of the turns answered from the session's records (a model agent's, the
    /// simulated user's): made by earlier reruns, so not in this one's meter, but part of
    /// the whole state `latest/` holds.
    reused_roles: std::collections::BTreeMap<String, trellis_engine::record::LlmUsage>,
    /// The execution nodes in which this rerun called an agent (suite, scenario, agent,
    /// repetition, node).
    talked_in: HashSet<(String, String, String, u32, String)>,
}

struct Recorded {
    view: View,
    summary: Option<RunSummary>,
    /// `latest/report.html`, when it was written.
    report_html: Option<PathBuf>,
}

impl Recorder {
    /// Counts a reused turn's LLM use as the run that made it counted it
    /// (`engine/src/execute/walk.rs` and the model protocols): its own model's calls (a
    /// Fixie agent's `llm`), else the usage it reported, one call a request; the simulated
    /// user's calls.
    fn add_reused(&mut self, turn: &trellis_engine::record::TurnRecord) {
        use trellis_engine::record::LlmCall;
        let mut add = |role: &str, call: &LlmCall| {
            self.reused_roles
                .entry(role.to_owned())
                .or_default()
                .add(call);
        };
        if !turn.llm.is_empty() {
            turn.llm.iter().for_each(|call| add("agent", call));
        } else if turn.prompt_tokens.is_some()
            || turn.completion_tokens.is_some()
            || turn.cost_usd.is_some()
        {
            let requests: usize = turn.exchanges.iter().map(|e| e.attempts.len()).sum();
            add(
                "agent",
                &LlmCall {
                    input_tokens: turn.prompt_tokens,
                    output_tokens: turn.completion_tokens,
                    cost: turn.cost_usd,
                    attempts: u32::try_from(requests.max(1)).unwrap_or(u32::MAX),
                    ..LlmCall::default()
                },
            );
        }
        turn.simulator
            .iter()
            .for_each(|call| add("simulator", call));
    }

    fn consume(mut self, mut rx: event::EventReceiver) -> Recorded {
        while let Some(event) = rx.blocking_recv() {
            if let Some(latest) = &mut self.latest {
                match &event {
                    // The whole state's LLM use: this rerun's calls and the reused turns'.
                    Event::RunFinished(s) if !self.reused_roles.is_empty() => {
                        let mut whole = s.clone();
                        for (role, usage) in &self.reused_roles {
                            whole
                                .llm_roles
                                .entry(role.clone())
                                .or_default()
                                .merge(usage);
                        }
                        latest.push(&Event::RunFinished(whole));
                    }
                    _ => latest.push(&event),
                }
            }
            if let Event::Node(node) = &event {
                for turn in node.turns.iter().filter(|t| t.reused) {
                    self.add_reused(turn);
                }
            }
            match &event {
                Event::RunStarted(info) => {
                    let mut info = trellis_engine::record::RunInfo::clone(info);
                    info.planned_trajectories = self.expected;
                    info.scenarios =
                        rerun_scenarios(&info.scenarios, &self.view.whys, &self.view.previous);
                    self.rerun
                        .push(&Event::RunStarted(std::sync::Arc::new(info)));
                }
                Event::Agent(_) | Event::Spans(_) => self.rerun.push(&event),
                Event::Node(node) => {
                    let called: Vec<_> = node.turns.iter().filter(|t| !t.reused).cloned().collect();
                    if !called.is_empty() {
                        self.talked_in.insert((
                            node.suite.clone(),
                            node.scenario.clone(),
                            node.agent.clone(),
                            node.repetition,
                            node.node.clone(),
                        ));
                        self.recorded.turns += called.len() as u64;
                        let mut node = node.clone();
                        node.turns = called;
                        self.rerun.push(&Event::Node(node));
                    }
                }
                Event::Trajectory(t) => {
                    let talked = t.nodes.iter().any(|n| {
                        self.talked_in.contains(&(
                            t.suite.clone(),
                            t.scenario.clone(),
                            t.agent.clone(),
                            t.repetition,
                            n.clone(),
                        ))
                    });
                    if self.view.on_trajectory(t, talked) {
                        let r = &mut self.recorded;
                        r.trajectories += 1;
                        match t.status {
                            TrajectoryStatus::Passed => r.passed += 1,
                            TrajectoryStatus::Failed => r.failed += 1,
                            TrajectoryStatus::Error => r.errors += 1,
                            TrajectoryStatus::Skipped => r.skipped += 1,
                            TrajectoryStatus::Invalid => r.invalid += 1,
                        }
                        self.rerun.push(&event);
                    }
                }
                Event::RunFinished(s) => {
                    self.summary = Some(s.clone());
                    let recorded = RunSummary {
                        run_id: s.run_id.clone(),
                        finished_at: s.finished_at.clone(),
                        duration_ms: s.duration_ms,
                        interrupted: s.interrupted,
                        ..self.recorded.clone()
                    };
                    self.rerun.push(&Event::RunFinished(recorded));
                }
            }
        }
        finish_record(self.rerun);
        let report_html = self.latest.and_then(finish_record);
        Recorded {
            view: self.view,
            summary: self.summary,
            report_html,
        }
    }
}

/// The repetitions a lowered `repeat` takes away, by scenario: the results kept of those
/// numbered from its new `repeat` on.
fn dropped_repetitions(
    plan: &Plan,
    whys: &BTreeMap<String, Why>,
    results: &HashMap<ResultKey, Standing>,
) -> BTreeMap<String, BTreeSet<u32>> {
    let mut dropped: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    // Only the scenarios whose `repeat` changed: nothing to write out on most reruns.
    if !whys.values().any(|w| *w == Why::Repeat) {
        return dropped;
    }
    let repeats: HashMap<String, u32> = plan
        .scenarios
        .iter()
        .map(|s| (format!("{}/{}", s.suite, s.scenario.id.value), s.repeat))
        .filter(|(key, _)| whys.get(key) == Some(&Why::Repeat))
        .collect();
    for (suite, scenario, _, _, repetition) in results.keys() {
        let key = format!("{suite}/{scenario}");
        if repeats.get(&key).is_some_and(|&n| *repetition >= n) {
            dropped.entry(key).or_default().insert(*repetition);
        }
    }
    dropped
}

/// The planned scenarios as a rerun's own record lists them: only the trajectories it
/// reran. The engine plans every scenario (an unchanged one's turns are answered from the
/// session's records); listed whole, the rerun's report said an unchanged trajectory was
/// "not recorded: the run stopped before it" and counted it planned. An unchanged
/// trajectory with a repetition the session has no result of (a raised `repeat`, one a
/// stopped rerun left unfinished) runs, and is recorded: it is kept.
fn rerun_scenarios(
    scenarios: &[trellis_engine::record::ScenarioInfo],
    whys: &HashMap<(String, String), Why>,
    previous: &HashMap<ResultKey, Standing>,
) -> Vec<trellis_engine::record::ScenarioInfo> {
    scenarios
        .iter()
        .filter_map(|s| {
            let key = format!("{}/{}", s.suite, s.scenario);
            let unfinished = |trajectory: &String| {
                s.agents.iter().any(|agent| {
                    (0..s.repeat).any(|repetition| {
                        !previous.contains_key(&(
                            s.suite.clone(),
                            s.scenario.clone(),
                            trajectory.clone(),
                            agent.clone(),
                            repetition,
                        ))
                    })
                })
            };
            let rerun: Vec<usize> = (0..s.trajectories.len())
                .filter(|&i| {
                    whys.get(&(key.clone(), s.trajectories[i].clone()))
                        .is_none_or(|w| *w != Why::Unchanged)
                        || unfinished(&s.trajectories[i])
                })
                .collect();
            if rerun.is_empty() {
                return None;
            }
            let mut kept = s.clone();
            kept.trajectories = rerun.iter().map(|&i| s.trajectories[i].clone()).collect();
            if s.fingerprints.len() == s.trajectories.len() {
                kept.fingerprints = rerun.iter().map(|&i| s.fingerprints[i].clone()).collect();
            }
            Some(kept)
        })
        .collect()
}

/// For each scenario rerun because of what it `needs` ([`Why::Dependency`]), the scenarios
/// it needs that rerun too (`suite/scenario`): its header line names them.
fn needs_changed(plan: &Plan, whys: &BTreeMap<String, Why>) -> HashMap<String, Vec<String>> {
    let key = |i: usize| {
        plan.scenarios
            .get(i)
            .map(|s| format!("{}/{}", s.suite, s.scenario.id.value))
    };
    let mut out = HashMap::new();
    for (i, s) in plan.scenarios.iter().enumerate() {
        let Some(this) = key(i) else { continue };
        if whys.get(&this) != Some(&Why::Dependency) {
            continue;
        }
        let mut needs: Vec<String> = s
            .needs
            .iter()
            .filter_map(|&n| key(n))
            // As the `needs` chain is followed (`reasons`): a need whose checks or `repeat`
            // alone changed does not make its dependant talk afresh.
            .filter(|k| whys.get(k).is_some_and(|w| w.moves_dependants()))
            .collect();
        needs.sort_unstable();
        needs.dedup();
        if !needs.is_empty() {
            out.insert(this, needs);
        }
    }
    out
}

/// A rerun asked for from the keyboard, as its header says it.
const ASKED: &str = "Enter pressed: every scenario talks to its agent afresh";

/// Lines read from standard input, one rerun asked for each (Enter): the way to rerun after
/// a change to an agent itself, which no file of the suites shows. `None` when standard
/// input is a terminal this process does not have in the foreground (`trellis watch &`:
/// reading it would stop the process), and the sender goes away at its end (`< /dev/null`).
fn asks_from_stdin() -> Option<mpsc::Receiver<()>> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() && !in_foreground() {
        return None;
    }
    // One slot: presses beyond one waiting rerun ask for nothing more (`yes | trellis
    // watch` holds no queue).
    let (tx, rx) = mpsc::channel(1);
    let spawned = std::thread::Builder::new()
        .name("trellis-watch-keys".into())
        .spawn(move || {
            use std::io::BufRead as _;
            // Bytes, not text: a line that is not UTF-8 is a press too.
            let mut line = Vec::new();
            while matches!(stdin.lock().read_until(b'\n', &mut line), Ok(n) if n > 0) {
                line.clear();
                if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                    break;
                }
            }
        });
    spawned.ok().map(|_| rx)
}

/// Whether this process's group owns the terminal on standard input.
fn in_foreground() -> bool {
    // SAFETY: both only read the process's own state; `tcgetpgrp` of a descriptor that
    // is no terminal returns -1.
    unsafe { libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp() }
}

/// The next rerun asked for; never, once there are none to come.
async fn next_ask(asks: &mut Option<mpsc::Receiver<()>>) {
    match asks {
        Some(rx) => match rx.recv().await {
            // Enter pressed again while waiting, or during a rerun: one rerun.
            Some(()) => while rx.try_recv().is_ok() {},
            None => {
                *asks = None;
                std::future::pending::<()>().await;
            }
        },
        None => std::future::pending::<()>().await,
    }
}

/// Whether a directory that appeared under a watched root holds a suite file, as loading
/// it would find them.
fn holds_suite_files(dir: &Path) -> bool {
    !trellis_dsl::parse::suite_files(dir).0.is_empty()
}

/// `suites/booking.kdl changed`, `3 files changed`, or the first run.
fn describe(paths: &[PathBuf]) -> String {
    let cwd = std::env::current_dir().ok();
    let show = |p: &PathBuf| {
        cwd.as_ref()
            .and_then(|cwd| p.strip_prefix(cwd).ok())
            .unwrap_or(p)
            .display()
            .to_string()
    };
    match paths {
        [] => "first run".to_string(),
        [one] => format!("{} changed", show(one)),
        [one, two] => format!("{} and {} changed", show(one), show(two)),
        many => format!("{} files changed", many.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rerun plans what it reran: an unchanged trajectory is left out, unless a
    /// repetition of it has no result in the session (a stopped rerun left it unfinished),
    /// which it then runs and records.
    #[test]
    fn a_rerun_plans_the_unchanged_trajectories_it_still_runs() {
        let info = trellis_engine::record::ScenarioInfo {
            suite: "s".into(),
            scenario: "c".into(),
            agents: vec!["a".into()],
            trajectories: vec!["left".into(), "right".into(), "edited".into()],
            fingerprints: vec!["1:1".into(), "2:2".into(), "3:3".into()],
            repeat: 2,
            ..Default::default()
        };
        let whys: HashMap<(String, String), Why> = [
            ("left", Why::Unchanged),
            ("right", Why::Unchanged),
            ("edited", Why::Steps),
        ]
        .into_iter()
        .map(|(t, why)| (("s/c".to_owned(), t.to_owned()), why))
        .collect();
        let standing = || Standing {
            status: TrajectoryStatus::Passed,
            why: None,
            unreached: false,
        };
        let key = |t: &str, repetition| {
            (
                "s".to_owned(),
                "c".to_owned(),
                t.to_owned(),
                "a".to_owned(),
                repetition,
            )
        };
        // `left` finished both repetitions; `right` only the first.
        let previous: HashMap<ResultKey, Standing> =
            [key("left", 0), key("left", 1), key("right", 0)]
                .into_iter()
                .map(|k| (k, standing()))
                .collect();
        let planned = rerun_scenarios(std::slice::from_ref(&info), &whys, &previous);
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].trajectories, ["right", "edited"]);
        assert_eq!(planned[0].fingerprints, ["2:2", "3:3"]);
        // Nothing reran: the scenario is not planned at all.
        let all_unchanged: HashMap<(String, String), Why> =
            whys.keys().map(|k| (k.clone(), Why::Unchanged)).collect();
        let full: HashMap<ResultKey, Standing> = ["left", "right", "edited"]
            .into_iter()
            .flat_map(|t| [key(t, 0), key(t, 1)])
            .map(|k| (k, standing()))
            .collect();
        assert!(rerun_scenarios(std::slice::from_ref(&info), &all_unchanged, &full).is_empty());
    }
}
