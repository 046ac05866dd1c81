//! `trellis import multiagent FILE|DIR`: MultiAgentEval scenario files to suites.
//!
//! A file becomes one suite holding one scenario ([`super::scenario_file`] does the mapping).
//! A directory is imported file by file (every `*.json` below it), mirroring its tree under
//! `--out`: `a/b.json` becomes `OUT/a/b.kdl`, and the agents every suite runs against are
//! written once, to `OUT/agents.kdl`, which each suite `include`s (so a suite checks and runs
//! alone as well as with the whole directory). Files are read, mapped, written and checked in
//! parallel; a file that cannot be imported is reported and the others are still written.
//!
//! Exit codes: 0 every file imported (unmapped parts are reported, not failures), 1 some
//! file could not be imported (the others are written), 2 usage or existing outputs without
//! `--replace` (nothing written).
//!
//! Every written suite is loaded back with the suite language's own loader (unless
//! `--no-check`) before the import says it is done: an importer bug cannot hand out a suite
//! that `trellis check` rejects.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use rayon::prelude::*;

use super::super::console::{count, errln};
use super::super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};
use super::agents_file::{AgentsFile, WantedAgent};
use super::scenario_file::{FileAgent, Generation, RenderOptions, ScenarioFile};
use super::{AGENTS_FILE, is_simple_id, kdl_string, write_file};

/// The agent id used when none is given.
const DEFAULT_AGENT_ID: &str = "multiagent";
/// The builtin reference agent the suites run against by default.
const DEFAULT_BUILTIN: &str = "support";

#[derive(Debug, Args)]
pub struct MultiAgentImportArgs {
    /// A scenario file (JSON, any of the three generations), or a directory: every `*.json`
    /// file below it is imported.
    source: PathBuf,
    /// Where to write: for a file, the suite file (default: standard output); for a
    /// directory, the output directory (required), mirroring the source tree, plus
    /// `agents.kdl`.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Replace files that already exist where the suites are written.
    #[arg(long)]
    replace: bool,
    /// The id of the agent every suite runs against (when the files name no agent of their
    /// own, or one of the --agent-* options is given). Default: for a file imported to
    /// `--out FILE`, that file's name without its extension (so suites imported side by side
    /// do not define the same agent), else `multiagent`.
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,
    /// Run every suite against the agent served at this URL (`POST URL`, e.g.
    /// http://127.0.0.1:8000/execute_task), instead of `metadata.agent` or the builtin.
    #[arg(long, value_name = "URL", group = "endpoint")]
    agent_url: Option<String>,
    /// Run every suite against this command (a process speaking JSON on stdin/stdout).
    #[arg(long, value_name = "COMMAND", group = "endpoint")]
    agent_command: Option<String>,
    /// Run every suite against the agent on this socket (tcp://HOST:PORT, unix:///PATH, …).
    #[arg(long, value_name = "ADDRESS", group = "endpoint")]
    agent_socket: Option<String>,
    /// Run every suite against a builtin agent. Default, when neither another --agent-*
    /// option nor a file's `metadata.agent` says otherwise: `support`.
    #[arg(long, value_name = "NAME", group = "endpoint")]
    agent_builtin: Option<String>,
    /// Do not load each written suite back to check it. Checking is what an import of
    /// thousands of files spends most of its time on; `trellis check OUT` does the same
    /// afterwards.
    #[arg(long)]
    no_check: bool,
    /// Only print the summary and the files that could not be imported, not what each file
    /// left unmapped (that is still written into each suite as comments).
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// Where an agent written by the import is reached.
#[derive(Debug, Clone)]
enum Endpoint {
    /// A file's `metadata.agent`, or an --agent-url/--agent-command/--agent-socket option.
    Reached(FileAgent),
    /// `builtin="NAME"`.
    Builtin(String),
}

/// An agent node to write: its endpoint and the action cap its scenarios need.
#[derive(Debug)]
struct AgentNode {
    id: String,
    /// The id of the agent at the same endpoint with the default cap (`id` itself when this
    /// is that agent).
    base: String,
    endpoint: Endpoint,
    max_actions: Option<u64>,
    /// `request "task-only"`: the agent is called as the AgentV harness (which reads AES
    /// workflow files) calls it, with the task text only and no history.
    task_only: bool,
}

impl AgentNode {
    /// The agent at the same endpoint, in the same form, with the default cap.
    fn base_node(&self) -> AgentNode {
        AgentNode {
            id: self.base.clone(),
            base: self.base.clone(),
            endpoint: self.endpoint.clone(),
            max_actions: cap_of_default(self.task_only),
            task_only: self.task_only,
        }
    }

    fn render(&self) -> String {
        let endpoint = match &self.endpoint {
            Endpoint::Builtin(name) => format!("builtin={}", kdl_string(name)),
            Endpoint::Reached(FileAgent::Url(url)) => format!("url={}", kdl_string(url)),
            Endpoint::Reached(FileAgent::Command(command)) => {
                format!("command={}", kdl_string(command))
            }
            Endpoint::Reached(FileAgent::Socket(socket)) => {
                format!("socket={}", kdl_string(socket))
            }
        };
        let mut out = format!(
            "agent {} protocol=\"multiagent\" {endpoint}",
            kdl_string(&self.id)
        );
        if let Some(max) = self.max_actions {
            let _ = write!(out, " max-actions={max}");
        }
        if self.task_only {
            // The AgentV harness that sends the task alone sends a tool's result as its
            // `message` too: an agent written for it is answered as it expects. (The
            // builtin reads either wording.)
            if matches!(self.endpoint, Endpoint::Builtin(_)) {
                out.push_str(" {\n    request \"task-only\"\n}");
            } else {
                out.push_str(" {\n    request \"task-only\"\n    feedback \"harness\"\n}");
            }
        }
        out.push('\n');
        out
    }
}

/// The action cap files of a request form get when they give no `max_turns`: the AgentV
/// harness's default for AES and transitional files (task-only), none (the protocol's own
/// default) for legacy ones.
fn cap_of_default(task_only: bool) -> Option<u64> {
    task_only.then_some(super::scenario_file::HARNESS_MAX_TURNS)
}

/// The id of the agent `base` with the action cap `cap` other than its default.
fn capped_id(base: &str, cap: u64) -> String {
    format!("{base}-max-{cap}")
}

/// `id` without a `-max-N` suffix [`capped_id`] gave it.
fn base_id(id: &str) -> &str {
    match id.rsplit_once("-max-") {
        Some((base, cap))
            if !base.is_empty() && !cap.is_empty() && cap.bytes().all(|b| b.is_ascii_digit()) =>
        {
            base
        }
        _ => id,
    }
}

/// The agent id when `--agent-id` is not given: a single file's `--out` file's stem, when
/// it is an id (so suites imported one file at a time into one directory do not define
/// the same agent twice; `import fixie` does the same), else the importer's default.
pub(super) fn default_agent_id(is_dir: bool, out: Option<&Path>, default: &str) -> String {
    out.filter(|_| !is_dir)
        .and_then(Path::file_stem)
        .and_then(|stem| stem.to_str())
        .filter(|stem| is_simple_id(stem))
        .unwrap_or(default)
        .to_owned()
}

/// One input file and what became of it.
struct Job {
    input: PathBuf,
    /// Path relative to the source directory (the file name for a file source).
    relative: PathBuf,
    parsed: Option<Result<ScenarioFile, String>>,
}

pub fn import_multiagent(args: &MultiAgentImportArgs) -> u8 {
    let started = Instant::now();
    if let Some(id) = &args.agent_id
        && !is_simple_id(id)
    {
        errln!("error: --agent-id `{id}` must be letters, digits, `_` or `-`");
        return EXIT_INVALID;
    }
    let metadata = match std::fs::metadata(&args.source) {
        Ok(metadata) => metadata,
        Err(e) => {
            errln!("error: {}: {e}", args.source.display());
            return EXIT_INVALID;
        }
    };
    let is_dir = metadata.is_dir();
    if is_dir && !directory_out(&args.source, args.out.as_deref()) {
        return EXIT_INVALID;
    }
    let mut jobs = if is_dir {
        let mut files = Vec::new();
        let mut ignored = Vec::new();
        if let Err(e) = collect_json(&args.source, &mut files, &mut ignored) {
            errln!("error: {e}");
            return EXIT_INVALID;
        }
        files.sort();
        if !args.quiet {
            report_ignored(&args.source, &mut ignored);
        }
        files
            .into_iter()
            .map(|input| Job {
                relative: input
                    .strip_prefix(&args.source)
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|_| input.clone()),
                input,
                parsed: None,
            })
            .collect::<Vec<_>>()
    } else {
        vec![Job {
            relative: PathBuf::from(args.source.file_name().unwrap_or_default()),
            input: args.source.clone(),
            parsed: None,
        }]
    };
    if jobs.is_empty() {
        errln!(
            "error: {} holds no .json scenario files",
            args.source.display()
        );
        return EXIT_INVALID;
    }

    jobs.par_iter_mut().for_each(|job| {
        let stem = job
            .input
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("scenario")
            .to_owned();
        job.parsed = Some(
            std::fs::read(&job.input)
                .map_err(|e| e.to_string())
                .and_then(|text| ScenarioFile::parse(&text, &stem).map_err(|e| e.to_string())),
        );
    });

    // A data file that a scenario names as its `metadata.dataset.path` sits in the
    // scenario tree, and is no scenario file: passed over, not an import that failed (a
    // real corpus could otherwise never import cleanly).
    let datasets: std::collections::HashSet<PathBuf> = jobs
        .iter()
        .filter_map(|job| {
            let Some(Ok(scenario)) = &job.parsed else {
                return None;
            };
            let path = job.input.parent()?.join(scenario.dataset_path.as_deref()?);
            path.canonicalize().ok()
        })
        .collect();
    if !datasets.is_empty() {
        jobs.retain(|job| {
            let is_dataset = matches!(job.parsed, Some(Err(_)))
                && job
                    .input
                    .canonicalize()
                    .is_ok_and(|path| datasets.contains(&path));
            if is_dataset && !args.quiet {
                errln!(
                    "note: {} is a scenario's dataset (`metadata.dataset.path`), not a \
                     scenario file: passed over",
                    super::one_line(&job.input.display().to_string())
                );
            }
            !is_dataset
        });
    }

    let explicit = explicit_agent(args);
    let agent_id = args
        .agent_id
        .clone()
        .unwrap_or_else(|| default_agent_id(is_dir, args.out.as_deref(), DEFAULT_AGENT_ID));
    // `--replace` into a directory keeps the agents file's agents (agents_file.rs).
    let existing = match args.out.as_deref().filter(|_| is_dir && args.replace) {
        Some(out) => match AgentsFile::read(&out.join(AGENTS_FILE)) {
            Ok(existing) => existing,
            Err(e) => {
                errln!("error: {e}");
                return EXIT_INVALID;
            }
        },
        None => None,
    };
    // Per endpoint and request form: AES and transitional files are what the AgentV harness
    // runs, calling agents with the task text only; legacy files are the MultiAgentEval
    // harness's, which sends the history too.
    let endpoint_ids = if explicit.is_none() {
        endpoint_agent_ids(args, &agent_id, &jobs, existing.as_ref())
    } else {
        BTreeMap::new()
    };
    // One agent per endpoint, request form and action cap: the harness runs each file with
    // its own `max_turns`, and `max-actions` is an agent's setting. The agent of the cap a
    // form's files get when they give none (the harness's 20 for AES and transitional files,
    // the protocol's own for legacy ones) keeps the base id; another cap N is `BASE-max-N`.
    // A single file's suite has one agent, the base id. An id so always names one cap, so a
    // directory imported again finds each agent's cap where it was.
    let mut agents: BTreeMap<(FileAgent, bool, Option<u64>), AgentNode> = BTreeMap::new();
    let mut default_agents: BTreeMap<(bool, Option<u64>), AgentNode> = BTreeMap::new();
    // The base id of the default agents of each request form.
    let mut default_bases: BTreeMap<bool, String> = BTreeMap::new();
    let mut agent_of: Vec<Option<String>> = Vec::with_capacity(jobs.len());
    let capped = |base: &str, task_only: bool, cap: Option<u64>| match cap {
        Some(cap) if is_dir && cap_of_default(task_only) != Some(cap) => capped_id(base, cap),
        _ => base.to_owned(),
    };
    for job in &jobs {
        let Some(Ok(scenario)) = &job.parsed else {
            agent_of.push(None);
            continue;
        };
        let task_only = scenario.generation != Generation::Legacy;
        let cap = scenario.max_turns;
        let node = match (&explicit, &scenario.agent) {
            (None, Some(endpoint)) => {
                let base = endpoint_ids
                    .get(&(endpoint.clone(), task_only))
                    .cloned()
                    .unwrap_or_else(|| agent_id.clone());
                agents
                    .entry((endpoint.clone(), task_only, cap))
                    .or_insert_with(|| AgentNode {
                        id: capped(&base, task_only, cap),
                        base,
                        endpoint: Endpoint::Reached(endpoint.clone()),
                        max_actions: cap,
                        task_only,
                    })
            }
            _ => {
                // The first form's default agents keep the chosen id; those of the other
                // form (a directory mixing generations) are named after their form.
                let next = if default_bases.is_empty() {
                    agent_id.clone()
                } else if task_only {
                    format!("{agent_id}-task-only")
                } else {
                    format!("{agent_id}-full")
                };
                let base = default_bases.entry(task_only).or_insert(next).clone();
                default_agents
                    .entry((task_only, cap))
                    .or_insert_with(|| AgentNode {
                        id: capped(&base, task_only, cap),
                        base,
                        endpoint: explicit
                            .clone()
                            .unwrap_or_else(|| Endpoint::Builtin(DEFAULT_BUILTIN.to_owned())),
                        max_actions: cap,
                        task_only,
                    })
            }
        };
        agent_of.push(Some(node.id.clone()));
    }
    let agent_nodes: Vec<&AgentNode> = default_agents.values().chain(agents.values()).collect();
    let agents_text: String = agent_nodes.iter().map(|a| a.render()).collect();
    let merged = existing.map(|file| {
        file.merge(
            &agent_nodes
                .iter()
                .map(|agent| WantedAgent {
                    id: agent.id.clone(),
                    text: agent.render(),
                    // With an --agent-* option every agent is reached there: the user
                    // saying where it is now.
                    explicit: explicit.is_some(),
                    like: (agent.base != agent.id).then(|| {
                        (
                            agent.base.clone(),
                            agent.base_node().render(),
                            agent.max_actions,
                        )
                    }),
                })
                .collect::<Vec<_>>(),
        )
    });

    // A bad --agent-url (or a file's endpoint) would make every suite fail its check: say so
    // once, as a usage error, before writing anything.
    if !agents_text.is_empty()
        && let Err(e) = check_text(&agents_text)
    {
        errln!("error: the agent options do not make a valid agent:\n{e}");
        return EXIT_INVALID;
    }
    let suite_names = suite_names(&jobs);
    // Suites of an earlier import into the directory that this one did not write.
    let mut left = Vec::new();
    let outcome = if is_dir {
        let Some(out) = args.out.as_deref() else {
            return EXIT_INVALID;
        };
        let agents_file = match &merged {
            Some(merged) => merged.text.clone(),
            None => {
                let mut header = String::new();
                super::comment(
                    &mut header,
                    "",
                    "The agents the suites imported by `trellis import multiagent` run against; \
                     edit the\nendpoints here (url=, command=, socket= or builtin=).",
                );
                format!("{header}\n{agents_text}")
            }
        };
        let written = write_directory(
            args,
            out,
            &jobs,
            &agent_of,
            &suite_names,
            &agents_file,
            &mut left,
        );
        if written.is_some()
            && let Some(merged) = &merged
        {
            errln!("{}", merged.note(&out.join(AGENTS_FILE)));
        }
        written
    } else {
        write_single(args, &jobs, &agent_of, &suite_names, &agents_text)
    };
    let Some(written) = outcome else {
        return EXIT_INVALID;
    };

    // Report per file: errors always, unmapped parts unless --quiet.
    let mut failed = 0usize;
    let mut unmapped_files = 0usize;
    let mut kept = 0usize;
    for (job, result) in jobs.iter().zip(&written) {
        match (&job.parsed, result) {
            (Some(Err(e)), _) => {
                failed += 1;
                errln!(
                    "error: {}: {e}",
                    super::one_line(&job.input.display().to_string())
                );
            }
            (_, Err(e)) => {
                failed += 1;
                errln!(
                    "error: {}: {e}",
                    super::one_line(&job.input.display().to_string())
                );
            }
            (Some(Ok(_)), Ok(written)) if written.report(&job.input, kept) => kept += 1,
            (Some(Ok(scenario)), Ok(_)) => {
                if !scenario.unmapped.is_empty() {
                    unmapped_files += 1;
                    if !args.quiet {
                        super::report_unmapped(&job.input, &scenario.unmapped);
                    }
                }
            }
            (None, Ok(_)) => {}
        }
    }
    let imported = jobs.len() - failed - kept;
    let target = args
        .out
        .as_deref()
        .map_or_else(|| "standard output".to_owned(), |p| p.display().to_string());
    if let Some(out) = &args.out {
        super::edits::report_left(out, &left);
    }
    if imported + kept == 0 {
        errln!(
            "nothing imported: none of {} could be imported{}",
            count(jobs.len() as u64, "file", "files"),
            if args.out.is_some() {
                format!("; nothing was written to {target}")
            } else {
                String::new()
            }
        );
        return EXIT_FAILED;
    }
    errln!(
        "imported {imported} of {} into {target} in {:.2}s; {unmapped_files} with \
         unmapped parts (listed in each suite's header){}{}",
        count(jobs.len() as u64, "file", "files"),
        started.elapsed().as_secs_f64(),
        if kept > 0 {
            format!("; {kept} kept as they were (edited, or without an import digest)")
        } else {
            String::new()
        },
        if failed > 0 {
            format!("; {failed} could not be imported")
        } else {
            String::new()
        }
    );
    if let Some(out) = &args.out
        && imported + kept > 0
    {
        errln!("check them with `trellis check {}`", out.display());
    }
    if failed > 0 { EXIT_FAILED } else { EXIT_OK }
}

/// The endpoint every suite uses when an --agent-* option is given.
fn explicit_agent(args: &MultiAgentImportArgs) -> Option<Endpoint> {
    if let Some(url) = &args.agent_url {
        Some(Endpoint::Reached(FileAgent::Url(url.clone())))
    } else if let Some(command) = &args.agent_command {
        Some(Endpoint::Reached(FileAgent::Command(command.clone())))
    } else if let Some(socket) = &args.agent_socket {
        Some(Endpoint::Reached(FileAgent::Socket(socket.clone())))
    } else {
        args.agent_builtin.clone().map(Endpoint::Builtin)
    }
}

/// The id of the agent of each endpoint the files name, per request form (see
/// agents_file.rs): the id the suite an earlier import wrote for one of its files names,
/// when the agents file still has it; else the agents file's agent at that endpoint; else
/// `ID-N`, numbered from 2 in the order the files name them, skipping ids taken. The
/// default agents' ids are never given to an endpoint.
fn endpoint_agent_ids(
    args: &MultiAgentImportArgs,
    agent_id: &str,
    jobs: &[Job],
    existing: Option<&AgentsFile>,
) -> BTreeMap<(FileAgent, bool), String> {
    let defaults = [
        agent_id.to_owned(),
        format!("{agent_id}-task-only"),
        format!("{agent_id}-full"),
    ];
    let usable = |id: &str| !defaults.iter().any(|d| d == id);
    let mut wanted: Vec<((FileAgent, bool), Option<String>)> = Vec::new();
    for job in jobs {
        if let Some(Ok(scenario)) = &job.parsed
            && let Some(endpoint) = &scenario.agent
        {
            let key = (endpoint.clone(), scenario.generation != Generation::Legacy);
            // The agent the suite written for this file last time runs against.
            let before = existing.zip(args.out.as_deref()).and_then(|(file, out)| {
                let id = suite_agent(&out.join(job.relative.with_extension("kdl")))?;
                let base = base_id(&id).to_owned();
                (file.has(&id) && usable(&base)).then_some(base)
            });
            match wanted.iter_mut().find(|(k, _)| *k == key) {
                Some((_, id)) => {
                    if id.is_none() {
                        *id = before;
                    }
                }
                None => wanted.push((key, before)),
            }
        }
    }
    let mut ids: BTreeMap<(FileAgent, bool), String> = BTreeMap::new();
    for (key, before) in &wanted {
        let (endpoint, task_only) = key;
        let (field, value) = match endpoint {
            FileAgent::Url(url) => ("url", url),
            FileAgent::Command(command) => ("command", command),
            FileAgent::Socket(socket) => ("socket", socket),
        };
        let at_endpoint = existing
            .and_then(|file| file.id_at(field, value, *task_only))
            .map(base_id)
            .filter(|id| usable(id))
            .map(str::to_owned);
        if let Some(id) = before.clone().or(at_endpoint)
            && !ids.values().any(|taken| *taken == id)
        {
            ids.insert(key.clone(), id);
        }
    }
    let mut n = 2usize;
    for (key, _) in wanted {
        if ids.contains_key(&key) {
            continue;
        }
        let id = loop {
            let id = format!("{agent_id}-{n}");
            n += 1;
            if !ids.values().any(|taken| *taken == id)
                && !existing.is_some_and(|file| file.ids().any(|known| base_id(known) == id))
            {
                break id;
            }
        };
        ids.insert(key, id);
    }
    ids
}

/// The agent the scenario of an imported suite file runs against (`agent "ID"` in its
/// `scenario`), when the file is there and reads.
fn suite_agent(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let document: kdl::KdlDocument = text.parse().ok()?;
    document
        .nodes()
        .iter()
        .filter(|node| node.name().value() == "scenario")
        .find_map(|scenario| {
            scenario
                .children()?
                .nodes()
                .iter()
                .find(|node| node.name().value() == "agent")?
                .get(0)?
                .as_string()
                .map(str::to_owned)
        })
}

/// Whether `out` can take a directory import of `source`; says why not.
pub(super) fn directory_out(source: &Path, out: Option<&Path>) -> bool {
    match out {
        None => errln!(
            "error: importing a directory needs --out DIR (one suite per file is written \
             there, mirroring {})",
            source.display()
        ),
        Some(out) if out.exists() && !out.is_dir() => errln!(
            "error: --out {} is a file; importing a directory writes one suite per file into \
             a directory (mirroring {}): name a directory",
            out.display(),
            source.display()
        ),
        Some(_) => return true,
    }
    false
}

/// Names the files [`collect_json`] did not read (the first few of them).
pub(super) fn report_ignored(source: &Path, ignored: &mut [PathBuf]) {
    if ignored.is_empty() {
        return;
    }
    ignored.sort();
    let shown: Vec<String> = ignored
        .iter()
        .take(5)
        .map(|p| p.strip_prefix(source).unwrap_or(p).display().to_string())
        .collect();
    errln!(
        "note: {} without the .json extension {} not read: {}{}",
        count(ignored.len() as u64, "file", "files"),
        if ignored.len() == 1 { "was" } else { "were" },
        super::one_line(&shown.join(", ")),
        if ignored.len() > shown.len() {
            format!(" and {} more", ignored.len() - shown.len())
        } else {
            String::new()
        }
    );
}

/// Every `*.json` below `dir`, not following symbolic links to directories (which could
/// loop), nor into hidden directories (`.git`, `.venv`); other files are listed in
/// `ignored`.
pub(super) fn collect_json(
    dir: &Path,
    files: &mut Vec<PathBuf>,
    ignored: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if file_type.is_dir() && entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if file_type.is_dir() {
            collect_json(&path, files, ignored)?;
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
            && (file_type.is_file() || path.is_file())
        {
            files.push(path);
        } else {
            ignored.push(path);
        }
    }
    Ok(())
}

/// A unique suite name per job: its path without the extension, `/` written as `.` (suite
/// names appear in `SUITE/ID` references), `-2`, `-3`… appended on a clash.
fn suite_names(jobs: &[Job]) -> Vec<String> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    jobs.iter()
        .map(|job| {
            let base: Vec<String> = job
                .relative
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().replace('/', "-"))
                .collect();
            let mut name = base.join(".");
            if name.trim().is_empty() {
                name = "scenario".into();
            }
            let count = seen.entry(name.clone()).or_insert(0);
            *count += 1;
            if *count > 1 {
                name = format!("{name}-{count}");
            }
            name
        })
        .collect()
}

/// Renders and writes every suite of a directory import, and the agents file; `None` when
/// nothing was written because outputs exist (exit 2).
fn write_directory(
    args: &MultiAgentImportArgs,
    out: &Path,
    jobs: &[Job],
    agent_of: &[Option<String>],
    suite_names: &[String],
    agents_file: &str,
    left: &mut Vec<PathBuf>,
) -> Option<Vec<Result<Written, String>>> {
    let agents_path = out.join(AGENTS_FILE);
    let targets: Vec<PathBuf> = jobs
        .iter()
        .map(|job| out.join(job.relative.with_extension("kdl")))
        .collect();
    if !args.replace {
        let existing = std::iter::once(&agents_path)
            .chain(
                targets
                    .iter()
                    .zip(jobs)
                    .filter(|(_, j)| matches!(j.parsed, Some(Ok(_))))
                    .map(|(t, _)| t),
            )
            .find(|p| p.exists());
        if let Some(path) = existing {
            errln!(
                "error: {} exists; pass --replace to replace the files this import writes",
                path.display()
            );
            return None;
        }
    }
    if let Err(e) = std::fs::create_dir_all(out) {
        errln!("error: {}: {e}", out.display());
        return None;
    }
    if let Err(e) = write_file(&agents_path, agents_file, true) {
        errln!("error: could not write the agents file: {e}");
        return None;
    }
    // Every suite includes it: checked once, before any suite is touched, so a mistake in
    // it (kept as the user left it, with --replace) is said as theirs, and the suites an
    // earlier import wrote stay.
    // (With no file to import, it has no agent to check.)
    if !args.no_check
        && jobs.iter().any(|job| matches!(job.parsed, Some(Ok(_))))
        && let Err(diagnostics) = trellis_dsl::load(
            &[&agents_path],
            &trellis_engine::protocol::registry::specs(),
        )
    {
        errln!(
            "{:?}\nerror: {} does not check, and every suite includes it: nothing was \
             imported, and no suite was touched; fix it and import again",
            miette::Report::new(diagnostics),
            agents_path.display()
        );
        return None;
    }
    let mut results: Vec<(usize, Result<Written, String>)> =
        (0..jobs.len()).map(|i| (i, Ok(Written::Written))).collect();
    results.par_iter_mut().for_each(|(i, result)| {
        let (Some(job), Some(target)) = (jobs.get(*i), targets.get(*i)) else {
            return;
        };
        let Some(Ok(scenario)) = &job.parsed else {
            return;
        };
        if *target == agents_path {
            *result = Err(format!(
                "its suite would be written over the agents file {}",
                agents_path.display()
            ));
            return;
        }
        let depth = job.relative.components().count().saturating_sub(1);
        let include = format!("{}{AGENTS_FILE}", "../".repeat(depth));
        let preamble = format!("include {}\n\n", kdl_string(&include));
        let text = scenario.render(&RenderOptions {
            suite: suite_names.get(*i).map_or("scenario", String::as_str),
            agent: agent_of
                .get(*i)
                .and_then(Option::as_deref)
                .unwrap_or(DEFAULT_AGENT_ID),
            source: &job.input.display().to_string(),
            preamble: &preamble,
        });
        *result = write_checked(target, &text, args.replace, !args.no_check);
    });
    // Suites an earlier import wrote here whose source this one did not import.
    let imported: std::collections::HashSet<PathBuf> = results
        .iter()
        .filter(|(i, r)| {
            r.is_ok()
                && jobs
                    .get(*i)
                    .is_some_and(|j| matches!(j.parsed, Some(Ok(_))))
        })
        .filter_map(|(i, _)| targets.get(*i).cloned())
        .chain([agents_path])
        .collect();
    if args.replace {
        *left = super::edits::left_from_earlier(out, &imported, "multiagent", &args.source);
    }
    Some(results.into_iter().map(|(_, r)| r).collect())
}

/// A single file: to `--out` (agent node inline) or standard output.
fn write_single(
    args: &MultiAgentImportArgs,
    jobs: &[Job],
    agent_of: &[Option<String>],
    suite_names: &[String],
    agents_text: &str,
) -> Option<Vec<Result<Written, String>>> {
    let Some(job) = jobs.first() else {
        return Some(Vec::new());
    };
    let Some(Ok(scenario)) = &job.parsed else {
        return Some(vec![Ok(Written::Written)]);
    };
    if let Some(out) = &args.out
        && out.exists()
        && !args.replace
    {
        errln!(
            "error: {} exists; pass --replace to replace it",
            out.display()
        );
        return None;
    }
    let suite = match &args.out {
        Some(out) => out
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned),
        None => None,
    }
    .or_else(|| suite_names.first().cloned())
    .unwrap_or_else(|| "scenario".into());
    let text = scenario.render(&RenderOptions {
        suite: &suite,
        agent: agent_of
            .first()
            .and_then(Option::as_deref)
            .unwrap_or(DEFAULT_AGENT_ID),
        source: &job.input.display().to_string(),
        preamble: &format!("{agents_text}\n"),
    });
    let result = match &args.out {
        Some(out) => write_checked(out, &text, args.replace, !args.no_check),
        None => fits(&text)
            .and_then(|()| {
                check_text(&text).map_err(|e| {
                    format!(
                        "internal: the suite written for it does not check; please report:\n{e}"
                    )
                })
            })
            .and_then(|()| {
                std::io::stdout()
                    .write_all(super::edits::stamped(&text).as_bytes())
                    .map_err(|e| format!("standard output: {e}"))
            })
            .map(|()| Written::Written),
    };
    Some(vec![result])
}

/// Writes a suite and (with `check`) loads it back with the suite language's loader; a
/// suite that does not load is removed and reported as an internal error, so one importer
/// bug cannot leave a directory that `trellis check` rejects as a whole.
pub(super) fn write_checked(
    path: &Path,
    text: &str,
    replace: bool,
    check: bool,
) -> Result<Written, String> {
    fits(text)?;
    if replace
        && path.exists()
        && let Some(why) = super::edits::edited_since_import(path)
    {
        return Ok(Written::Kept(path.to_path_buf(), why));
    }
    // What an earlier import wrote there comes back when the new suite does not check.
    let before = if replace {
        std::fs::read(path).ok()
    } else {
        None
    };
    write_file(path, &super::edits::stamped(text), replace)?;
    if check
        && let Err(diagnostics) =
            trellis_dsl::load(&[path], &trellis_engine::protocol::registry::specs())
    {
        let restored = match &before {
            Some(old) => std::fs::write(path, old).is_ok(),
            None => {
                let _ = std::fs::remove_file(path);
                false
            }
        };
        let what = if restored {
            "so the suite that was there is kept"
        } else {
            "so it was removed"
        };
        // A problem in another file it includes is that file's, not the importer's.
        let own = trellis_dsl::canonical(path);
        let elsewhere = diagnostics
            .iter()
            .filter_map(|d| diagnostics.files().get(d.file?))
            .map(|f| trellis_dsl::canonical(&f.path))
            .find(|p| *p != own);
        return Err(match elsewhere {
            Some(other) => format!(
                "the suite written for it does not check because of {}, which it \
                 includes, {what}:\n{:?}",
                other.display(),
                miette::Report::new(diagnostics)
            ),
            None => format!(
                "internal: the suite written for it does not check, {what}; please report:\n{:?}",
                miette::Report::new(diagnostics)
            ),
        });
    }
    Ok(Written::Written)
}

/// What [`write_checked`] did with a suite's file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum Written {
    #[default]
    Written,
    /// `--replace` found the file edited since it was imported (or could not tell), and
    /// left it as it is.
    Kept(PathBuf, super::edits::Kept),
}

/// Files kept named one by one, before the rest are only counted.
const KEPT_NAMED: usize = 10;

impl Written {
    /// Names a file kept, on the console (the first [`KEPT_NAMED`] of `kept_before` + 1);
    /// whether it was one.
    pub(super) fn report(&self, input: &Path, kept_before: usize) -> bool {
        let Written::Kept(path, why) = self else {
            return false;
        };
        if kept_before < KEPT_NAMED {
            let why = match why {
                super::edits::Kept::Edited => "it was edited since it was imported",
                super::edits::Kept::NoDigest => {
                    "it has no import digest (written by hand, or imported by an earlier \
                     trellis), so it may hold edits"
                }
            };
            errln!(
                "kept {}: {why}, so {} was not imported into it; delete it (or import into \
                 another file) to take this import",
                path.display(),
                input.display()
            );
        } else if kept_before == KEPT_NAMED {
            errln!("kept more files for the same reason: the summary counts them");
        }
        true
    }
}

/// Whether every top-level node of `text` (as the importers write it: a node starts on a
/// line of its own at column 0) is within the size the suite loader parses
/// (`trellis_dsl::depth::MAX_NODE_SIZE`, docs/language.md "Limits"). A scenario holding a
/// whole document in its text is bigger, and no suite could load it.
pub(super) fn fits(text: &str) -> Result<(), String> {
    let limit = trellis_dsl::depth::MAX_NODE_SIZE;
    let mut node: Option<(&str, usize)> = None;
    let check = |node: Option<(&str, usize)>| match node {
        Some((head, size)) if size > limit => Err(format!(
            "`{}` would be {} KiB of KDL, over the {} KiB one top-level node of a suite may \
             hold (docs/language.md, \"Limits\"): its text is too long to import",
            head.chars()
                .take(60)
                .collect::<String>()
                .trim_end_matches(" {"),
            size.div_ceil(1024),
            limit / 1024
        )),
        _ => Ok(()),
    };
    for line in text.split_inclusive('\n') {
        let starts_node = line
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '}')
            && !line.starts_with("//");
        if starts_node {
            check(node.take())?;
            node = Some((line.trim_end(), 0));
        }
        if let Some((_, size)) = &mut node {
            *size += line.len();
        }
    }
    check(node)
}

/// Checks KDL that is not written to a file (standard output, the agents alone) through a
/// temporary file.
pub(super) fn check_text(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let path = dir.path().join("suite.kdl");
    write_file(&path, text, false)?;
    trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .map(drop)
        .map_err(|diagnostics| format!("{:?}", miette::Report::new(diagnostics)))
}
