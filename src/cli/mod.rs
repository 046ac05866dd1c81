//! Commands and their arguments. Exit codes: 0 all passed, 1 a criterion failed or a fault
//! occurred (with `--baseline`, and for `compare`: a regression; for `calibrate`: a judge
//! below the agreement floor), 2 invalid suite, usage, unknown run or bad labels file, 3
//! results incomplete (a results file could not be written), 4 stopped at an LLM budget,
//! 130 stopped by Ctrl-C, 143 stopped by SIGTERM, 129 stopped by SIGHUP (`trellis agent`, a server, exits 0
//! when a signal stops it).

mod agent;
mod bench;
mod calibrate;
mod check_json;
mod complete;
mod console;
mod fmt;
mod freeze;
mod github;
mod history;
mod import;
mod init;
mod merge;
mod meta;
mod recorded_suites;
mod recorder;
mod rejudge;
mod resume;
mod run;
mod shard;
mod show;
mod sites;
mod stop;
mod variance;
mod watch;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::{ArgValueCandidates, ArgValueCompleter};
use trellis_dsl::graph::{GraphFormat, TrajectoryGraph};
use trellis_engine::plan::{Plan, Selection};

pub(crate) use bench::phases::write_if_asked as write_bench_phases;
pub(crate) use complete::setup as answer_completion_request;

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_INVALID: u8 = 2;
/// The run finished but a results file (journal, a table, HTML or JUnit) could not be written.
pub const EXIT_INCOMPLETE: u8 = 3;
/// The run stopped early at its LLM budget (`--max-llm-calls`, `--max-llm-cost`); finished
/// trajectories are written.
pub const EXIT_BUDGET: u8 = 4;

/// What a finished run that nothing failed must say of itself when not one of its
/// trajectories was decided (each was skipped or invalid): its exit code 0 means only that
/// nothing failed, and a CI log that shows nothing else reads as an agent that works.
/// `None` when something was decided, or nothing ran at all.
pub fn nothing_checked(s: &trellis_engine::record::RunSummary) -> Option<String> {
    if s.trajectories == 0 || s.passed + s.failed + s.errors > 0 || s.interrupted {
        return None;
    }
    let why = match (s.skipped, s.invalid) {
        (_, 0) => "every one was skipped, its checks not run; --strict fails such a run",
        (0, _) => "every one was invalid: its simulated user broke character",
        _ => "every one was skipped or invalid",
    };
    Some(format!(
        "nothing was checked: of {}, none passed or failed ({why}); report.html says why \
         for each",
        console::count(s.trajectories, "trajectory", "trajectories")
    ))
}

/// Declarative evals for conversational AI agents.
#[derive(Debug, Parser)]
#[command(name = "trellis", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One `Command` is parsed per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Write a new project for an agent of PROTOCOL: suites that pass at once against the
    /// protocol's built-in reference agent, an agents file to point at yours, a CI workflow
    /// gated on a pinned baseline, and a README.
    ///
    /// Example: trellis init my-evals --protocol openai && cd my-evals && trellis run
    ///
    /// Files that exist are not overwritten without --force (`.gitignore` only gets `runs/`
    /// appended). Exit code 0 written, 1 a file could not be written, 2 usage (no or an
    /// unknown --protocol, files in the way, DIR is a file).
    Init(init::InitArgs),
    /// Run suites against their agents and write Parquet tables, report.html and junit.xml.
    ///
    /// Example: trellis run suites/ --jobs 32 --filter 'book-*'
    ///
    /// Results go to runs/<run-id>/ (or --out). Exit code 0 when no trajectory failed or
    /// faulted (a skipped trajectory, or an invalid one whose simulated user broke
    /// character, does not fail a run; with --strict a skipped one does), 1 when a
    /// criterion failed or an agent faulted (with --baseline: when something regressed), 2
    /// when a suite, the command line or the baseline is invalid, 3 when a results file
    /// could not be written or the comparison could not be made, 4 when an LLM budget
    /// (--max-llm-calls, --max-llm-cost) stopped the run, 130 after Ctrl-C, 143 after
    /// SIGTERM, 129 after SIGHUP (finished trajectories are reported either way).
    Run(RunArgs),
    /// Validate suites without running anything; prints every problem at once.
    ///
    /// Example: trellis check suites/
    ///
    /// With --explain NODE, prints what a node of the suite language takes instead (its
    /// arguments, properties and block): `scenario`, `branch`, `tool.mock`, `expect.reply`.
    Check(CheckArgs),
    /// Lay suite files out canonically: four spaces per block, one space between arguments,
    /// every comment, string and number kept as written.
    ///
    /// Example: trellis fmt --check
    ///
    /// Formats the files `run` would load (every *.kdl below the given directories, default
    /// ./suites, and what they include), writing each changed file atomically and printing
    /// its name. A file that does not parse gets the diagnostics `check` prints, and nothing
    /// is written (exit 2). --check writes nothing: it lists the files that would change
    /// with a short diff and exits 1 if any would, 0 otherwise.
    Fmt(fmt::FmtArgs),
    /// List the scenarios that would run and their trajectories.
    ///
    /// Example: trellis list suites/ --filter 'booking/*'
    List(ListArgs),
    /// Print the trajectory graph of each scenario, or the scenario `needs` graph.
    ///
    /// Example: trellis graph suites/booking.kdl --format mermaid
    Graph(GraphArgs),
    /// Combine the shard runs of `trellis run --shard I/N` into one run, as if the plan had
    /// run unsharded: tables, report.html, junit.xml, summary and history.
    ///
    /// Example: trellis merge results/shard-* --out runs/merged
    ///
    /// Checks that the shards come from the same suites and split and cover the plan
    /// without gap or overlap, and says what is missing otherwise. Exit code 0 when every
    /// trajectory passed, 1 when one failed or faulted, or when shards are missing (nothing
    /// is written unless --allow-partial), 2 when a directory is not a shard or the shards
    /// do not belong together, 3 when a results file could not be written.
    Merge(merge::MergeArgs),
    /// Rebuild a run's Parquet tables, report.html and junit.xml from its journal, for
    /// instance after the run was killed.
    ///
    /// Example: trellis report runs/20261122T035000.123Z-1a2b --out /tmp/rebuilt
    Report(ReportArgs),
    /// Measure the engine: N trajectories of 4 turns against the builtin agent, in-process.
    ///
    /// Example: cargo run --release -- bench --trajectories 10000 --jobs 256
    Bench(bench::BenchArgs),
    /// Re-score a recorded run's `judge`/`outcome` checks with the suites' current judges,
    /// without calling any agent, into a new run directory linked to the original.
    ///
    /// Example: trellis rejudge runs/20261122T035000.123Z-1a2b suites/ --llm-cache .llm-cache
    Rejudge(rejudge::RejudgeArgs),
    /// Write a path an `attack` search found as an ordinary scripted scenario, for
    /// regression: its user turns fixed, the attack's judge as its check (passing when the
    /// agent resists).
    ///
    /// Example: trellis freeze runs/<run-id> main~a1-2~a2-1 -o suites/frozen.kdl
    ///
    /// Exit code 0 written, 1 the file could not be written, 2 no such run or trajectory,
    /// or a trajectory that is not an attack path.
    Freeze(freeze::FreezeArgs),
    /// Say how much of each scenario's outcome variance comes from the agent, the simulated
    /// user and the judge: re-judge the recorded transcripts, replay the recorded users to
    /// the agent, and rerun freely, each --repeats times (docs/simulator.md).
    ///
    /// Example: trellis variance runs/<run-id> --repeats 5 --llm-cache .llm-cache
    /// (the suites are the files the run recorded; give PATHS to use others).
    ///
    /// Exit code 0 measured, 2 no such run, or its suites gone, changed or not recorded, 4
    /// an LLM budget stopped it, 130/143 SIGINT/SIGTERM (what finished is still decomposed
    /// and written).
    Variance(variance::VarianceArgs),
    /// Rerun suites as they are edited, only what each save changed, with a live view;
    /// --serve keeps the latest report open in a browser tab.
    ///
    /// Example: trellis watch suites/ --serve
    ///
    /// Watches every file the suites load. A broken edit prints its diagnostics and keeps
    /// the last results; each rerun is recorded in its own run directory under --out
    /// (default runs/). Runs until Ctrl-C or SIGTERM (exit 130); Enter reruns
    /// every scenario afresh (after a change to an agent itself).
    Watch(watch::WatchArgs),
    /// List the runs in a runs directory; name a run, or pin one as the baseline.
    ///
    /// Example: trellis runs; trellis runs name 20261122T035000.123Z-1a2b v1; trellis runs pin v1
    ///
    /// Runs are listed oldest first. RUN is a run directory, a run id (or a unique prefix
    /// of one), a name, or `pinned`.
    #[command(visible_alias = "history")]
    Runs(history::RunsArgs),
    /// Compare two runs: per run metric, scenario, branch and check; exit 1 on a regression.
    ///
    /// Example: trellis compare v1 v2 --max-latency-increase 50
    ///
    /// Without runs: the pinned baseline (else the second most recent finished run) against
    /// the most recent finished run. Exit code 0 when nothing regressed past the
    /// thresholds, 1 on a regression, 2 when a run cannot be found or read.
    Compare(history::CompareArgs),
    /// Print a run's transcripts: each turn's message, tool calls, answer, time and fault,
    /// then the checks; by default the trajectories that did not pass.
    ///
    /// Example: trellis show --filter 'booking/*'
    ///
    /// Read from the run's journal (default: the most recent run in --dir), for a failure
    /// met in a CI log or over SSH, where report.html is not at hand.
    Show(show::ShowArgs),
    /// Measure how well each LLM judge of a run agrees with human labels: Cohen's kappa,
    /// Pearson and Spearman correlation, mean absolute error, with 95% intervals; writes
    /// calibration.json into the run directory.
    ///
    /// Example: trellis calibrate runs/20261122T035000.123Z-1a2b labels.csv --min-kappa 0.6
    ///
    /// A judge below the floor is marked; `compare` and `run --baseline` then do not gate
    /// on the run's mean judge score. Exit code 0 no judge below the floor, 1 a judge is
    /// below it, 2 usage, an unknown run, a run without judged checks or a bad labels file,
    /// 3 calibration.json could not be written.
    Calibrate(calibrate::CalibrateArgs),
    /// Write suites from what already exists: a Fixie agent's few-shots, MultiAgentEval
    /// scenario files, Connexity test cases.
    ///
    /// Example: trellis import multiagent scenarios/ --out suites/imported
    ///
    /// Exit code 0 written, 1 a source (or, for a directory, one of its files) could not be
    /// read or imported, 2 usage (such as an existing output without --force/--replace).
    Import(import::ImportArgs),
    /// Serve a builtin reference agent: over HTTP (default), newline-delimited JSON on a
    /// socket, or stdin/stdout as a process (the `support` MultiAgentEval agent).
    ///
    /// Example: trellis agent support --listen tcp:127.0.0.1:0
    ///
    /// --http and --listen print the address clients use on stdout; Ctrl-C or SIGTERM
    /// stops the server cleanly (exit 0). --stdio answers one JSON line per request line
    /// until stdin ends; --per-call answers the whole of stdin once.
    Agent(agent::AgentArgs),
    /// Serve the Language Server Protocol on stdin/stdout for editors: the diagnostics of
    /// `trellis check` as you type, completion, hover, go to definition, references, rename
    /// and the outline of suite files.
    ///
    /// Example (Neovim): vim.lsp.start({ name = "trellis", cmd = { "trellis", "lsp" } })
    ///
    /// Started by the editor, not by hand; docs/editors.md sets up Neovim, Helix and VS Code.
    Lsp,
    /// Print the script that completes `trellis` commands, flags, run ids and run names in
    /// SHELL.
    ///
    /// Example: source <(trellis completions bash)
    ///
    /// The script asks `trellis` for the candidates as you type, so it stays right when
    /// `trellis` is upgraded and knows the runs in the runs directory (`--dir`, else
    /// runs/). See the README for each shell's installation.
    Completions(complete::CompletionsArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    paths: PathArgs,
    /// Print what the node NODE of the suite language takes (e.g. `scenario`,
    /// `scenario.branch`, `tool.mock`) instead of checking suites.
    #[arg(long, value_name = "NODE")]
    explain: Option<String>,
    /// `json`: each problem as a JSON line on stdout (file, line, column, end, code,
    /// message, labels, help), then a `summary` line; for tools that annotate files.
    #[arg(long, value_enum, default_value_t = MessageFormat::Human)]
    message_format: MessageFormat,
}

#[derive(Debug, Args)]
struct PathArgs {
    /// Suite files or directories (every *.kdl below). Default: ./suites
    paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
struct SelectArgs {
    /// Only scenarios whose id (or suite/id) matches this glob; repeatable.
    #[arg(long = "filter", value_name = "GLOB")]
    filters: Vec<String>,
    /// Only scenarios carrying this tag (scenario or suite tags); repeatable.
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// Also run draft and archived scenarios.
    #[arg(long)]
    include_inactive: bool,
}

impl SelectArgs {
    fn selection(&self) -> Selection {
        Selection {
            filters: self.filters.clone(),
            tags: self.tags.clone(),
            include_inactive: self.include_inactive,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    paths: PathArgs,
    #[command(flatten)]
    select: SelectArgs,
    /// Output directory. Default: runs/<run-id>. A directory that holds an earlier run, or
    /// files of the names a run writes (junit.xml, report.html, …), is refused unless
    /// --replace is given.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Let --out replace the earlier run in that directory (its journal, tables and reports
    /// are deleted first).
    #[arg(long)]
    replace: bool,
    /// Finish the run in DIR that was cut short (killed, out of memory, a lost pod): its
    /// finished trajectories are kept and not sent to the agent again, the rest run, and DIR
    /// ends up holding one finished run. Give the same suites and selection as the run was
    /// started with; a change to what a finished trajectory sends or checks is refused.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["out", "replace"])]
    resume: Option<PathBuf>,
    /// A check that did not run, or a trajectory that was skipped, fails its trajectory
    /// (and so the run).
    #[arg(long)]
    strict: bool,
    /// Replay the simulated user turns recorded in this run (directory, id or name) instead
    /// of simulating them, for as long as the agent answers as it did then; from the first
    /// divergence on, a path's simulated turns are written fresh. Turns are marked in
    /// turns.parquet (`user_source`: recorded or fresh). See docs/simulator.md.
    #[arg(long, value_name = "RUN", conflicts_with = "resume",
          add = ArgValueCandidates::new(complete::runs))]
    replay_users: Option<String>,
    /// Agent calls in flight at once across the run. Each job may hold about 4 open
    /// descriptors (more with several agents: a builtin agent holds both ends of its
    /// connections), besides about 50 of the run's own: a soft limit below what JOBS needs
    /// is raised, as far as the hard limit allows; under a hard limit too low for JOBS,
    /// JOBS is lowered to what fits (it is said).
    #[arg(long, short = 'j', default_value_t = 32, value_parser = jobs_in_range)]
    jobs: usize,
    /// Run every selected scenario N times, whatever its `repeat` says: a flakiness run of
    /// the same suites (pass@k and pass^k are over these). Give it again to --resume such a
    /// run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    repeat: Option<u32>,
    /// No progress output; only the summary.
    #[arg(long, short = 'q')]
    quiet: bool,
    /// A label recorded with the run (run.json, runs.parquet, `trellis runs`); repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = meta::parse_label)]
    labels: Vec<(String, String)>,
    /// Compare with this run when done (directory, id, name; without a value the run
    /// pinned in the runs directory this run is written to: `runs/`, or the parent of
    /// --out) and exit by the comparison: 1 on a regression past the thresholds, 0
    /// otherwise, even when trajectories fail that failed in the baseline too.
    #[arg(long, value_name = "RUN", num_args = 0..=1, default_missing_value = "pinned",
          add = ArgValueCandidates::new(complete::runs))]
    baseline: Option<String>,
    #[command(flatten)]
    thresholds: history::ThresholdArgs,
    /// `human` (default) or `json`: one JSON object per line on stdout (`run_started`,
    /// `trajectory_finished`, `run_finished`) instead of the progress and the summary.
    #[arg(long, value_enum, default_value_t = MessageFormat::Human)]
    message_format: MessageFormat,
    /// Cache LLM answers (judges) in this directory, keyed by the request and the
    /// repetition: a rerun reuses them. Several runs may share one directory.
    #[arg(long, value_name = "DIR")]
    llm_cache: Option<PathBuf>,
    /// read-write: serve hits, call and store misses. off: ignore the cache. replay-only: a
    /// miss is an error naming the call (CI: prove a run needs no LLM call).
    #[arg(long, value_enum, default_value_t = LlmCacheMode::ReadWrite, requires = "llm_cache")]
    llm_cache_mode: LlmCacheMode,
    /// Stop the run gracefully once this many LLM requests were sent (simulated users,
    /// judges, attackers, models under test; each retry counts, cache hits do not): no new
    /// request is sent, requests in flight finish, finished trajectories are written; exit
    /// code 4.
    #[arg(long, value_name = "N", value_parser = calls_in_range)]
    max_llm_calls: Option<u64>,
    /// Stop the run gracefully once the LLM calls cost this much (at the providers'
    /// `input-price`/`output-price`; unpriced calls cost nothing), as --max-llm-calls does.
    /// Requests in flight reserve what they may cost, so it is passed by at most one
    /// request's cost.
    #[arg(long, value_name = "COST", value_parser = positive_cost)]
    max_llm_cost: Option<f64>,
    /// Run only shard I of N (I from 1): one of N disjoint parts of the plan, each scenario
    /// whole; `trellis merge` combines the N runs. Without it, a Kubernetes Indexed Job
    /// (JOB_COMPLETION_INDEX with --shards or TRELLIS_SHARDS), GitLab `parallel`
    /// (CI_NODE_INDEX, CI_NODE_TOTAL) or Buildkite `parallelism` (BUILDKITE_PARALLEL_JOB,
    /// BUILDKITE_PARALLEL_JOB_COUNT) says which shard this is. 1/1 runs the whole plan
    /// whatever those say.
    #[arg(long, value_name = "I/N", conflicts_with = "shards")]
    shard: Option<trellis_engine::shard::Shard>,
    /// How many shards there are, where the runner sets only the index (Kubernetes'
    /// JOB_COMPLETION_INDEX); same as TRELLIS_SHARDS.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(trellis_engine::shard::MAX_SHARDS)))]
    shards: Option<u32>,
    /// The run whose measured scenario costs balance the shards (directory, id or name), or
    /// `none` to balance by trajectory count. Default: the latest finished whole run of the
    /// same suites next to --out. Every shard must use the same.
    #[arg(long, value_name = "RUN|none")]
    shard_costs: Option<String>,
    /// Receive the agents' OpenTelemetry spans on this address (OTLP/HTTP, protobuf or
    /// JSON, `POST /v1/traces`), e.g. 127.0.0.1:4318; point the agents'
    /// OTEL_EXPORTER_OTLP_ENDPOINT at it. Spans land in spans.parquet. Agents with
    /// `spans #true` get a receiver on a free port without it.
    #[arg(long, value_name = "ADDR", value_parser = receiver_address)]
    otlp_receiver: Option<std::net::SocketAddr>,
    /// Export the run's own spans (run, nodes, turns, exchanges, trajectories, judge and
    /// simulator calls) to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (protobuf;
    /// `/v1/traces` is added). Without it, OTEL_EXPORTER_OTLP_ENDPOINT (or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns the export on, with
    /// OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_EXPORTER_OTLP_COMPRESSION
    /// and OTEL_SERVICE_NAME.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// How long a turn of a `spans #true` agent waits after the answer for the agent's
    /// spans (its root span) before its checks run.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = trellis_dsl::parse::parse_duration)]
    spans_wait: std::time::Duration,
    /// How long the end of the run waits for spans that have not arrived yet (batch
    /// exporters send late): for turns of `spans #true` agents, and of every agent when
    /// `--otlp-receiver` is given.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = trellis_dsl::parse::parse_duration)]
    spans_grace: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    Human,
    Json,
}

/// `--llm-cache-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LlmCacheMode {
    ReadWrite,
    Off,
    ReplayOnly,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// A run directory holding its journal, or a run id (a unique prefix) or name in runs/.
    #[arg(add = ArgValueCompleter::new(complete::run_dirs))]
    dir: PathBuf,
    /// Write the rebuilt files into this directory (created if missing) instead of the run
    /// directory, which is left untouched.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    paths: PathArgs,
    #[command(flatten)]
    select: SelectArgs,
    /// Also print each scenario's and execution node's fingerprint (conversation and checks
    /// halves): what `trellis watch` compares to decide what reruns.
    #[arg(long, short = 'v')]
    verbose: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Dot,
    Mermaid,
}

#[derive(Debug, Args)]
struct GraphArgs {
    #[command(flatten)]
    paths: PathArgs,
    #[command(flatten)]
    select: SelectArgs,
    #[arg(long, value_enum, default_value_t = Format::Dot)]
    format: Format,
    /// Print the scenario `needs` graph instead of trajectory graphs.
    #[arg(long)]
    needs: bool,
}

/// `--jobs` between 1 and the engine's limit.
/// `--max-llm-calls`: a whole number from 1.
fn calls_in_range(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a whole number")),
    }
}

/// `--max-llm-cost`: a positive, finite number.
fn positive_cost(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(c) if c.is_finite() && c > 0.0 => Ok(c),
        Ok(_) => Err("must be a positive number".into()),
        Err(_) => Err(format!("`{text}` is not a number")),
    }
}
/// `--otlp-receiver ADDR`: an address to listen on, `IP:PORT`; `localhost:PORT` is the
/// loopback address, and an `http://` written as for the agents' endpoint is left off.
pub(crate) fn receiver_address(text: &str) -> Result<std::net::SocketAddr, String> {
    let bare = text
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let bare = match bare.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => bare.to_owned(),
    };
    bare.parse().map_err(|_| {
        format!(
            "`{text}` is not an address to listen on: give IP:PORT or localhost:PORT, e.g. \
             127.0.0.1:4318 (0.0.0.0:4318 for agents on other machines)"
        )
    })
}

pub fn jobs_in_range(text: &str) -> Result<usize, String> {
    let jobs: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number"))?;
    if (1..=trellis_engine::execute::MAX_JOBS).contains(&jobs) {
        Ok(jobs)
    } else {
        Err(format!(
            "must be between 1 and {}",
            trellis_engine::execute::MAX_JOBS
        ))
    }
}

/// What starts the reference agents (`builtin="…"`) for a run of this executable.
pub(crate) fn launcher() -> trellis_agents::BuiltinLauncher {
    let launcher = trellis_agents::BuiltinLauncher::new();
    // Builtins served as processes run this executable (`transport="process"`).
    match std::env::current_exe() {
        Ok(exe) => launcher.with_executable(exe),
        Err(_) => launcher,
    }
}

impl Cli {
    /// How many descriptors the command may hold open at once, reserved before it starts
    /// (`crate::descriptors`): for a command that calls agents, a connection for each call
    /// in flight, as many again idle in the pools (another agent's, a judge's), and room for
    /// the run's files; for an agent served, its clients. Others open a handful: 0.
    pub fn descriptors_wanted(&self) -> usize {
        let in_flight = match &self.command {
            Command::Run(args) => args.jobs,
            Command::Watch(args) => args.jobs,
            Command::Bench(args) => args.jobs,
            Command::Variance(args) => args.jobs,
            Command::Agent(_) => 128,
            _ => return 0,
        };
        in_flight.saturating_mul(2).saturating_add(128)
    }
}

pub fn main(cli: Cli) -> u8 {
    let code = command(cli);
    // Output lost to a full disk or an I/O error (not a closed pipe): a program reading it
    // would read part of it, so the command did not do all it was asked to.
    match console::stdout_lost() {
        Some(why) => {
            console::errln!("error: could not write to stdout ({why}): its output is incomplete");
            if code <= EXIT_FAILED {
                EXIT_INCOMPLETE
            } else {
                code
            }
        }
        None => code,
    }
}

fn command(cli: Cli) -> u8 {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => match &args.explain {
            Some(node) => explain(node),
            None => check(&args.paths, args.message_format == MessageFormat::Json),
        },
        Command::Fmt(args) => fmt::fmt(args),
        Command::List(args) => list(&args),
        Command::Graph(args) => graph(&args),
        Command::Report(args) => report(&args),
        Command::Merge(args) => merge::merge(args),
        Command::Bench(args) => bench::bench(args),
        Command::Watch(args) => watch::watch(args),
        Command::Import(args) => import::import(args),
        Command::Init(args) => init::init(args),
        Command::Runs(args) => history::runs(args),
        Command::Compare(args) => history::compare_command(args),
        Command::Show(args) => show::show(args),
        Command::Calibrate(args) => calibrate::calibrate(args),
        Command::Agent(args) => agent::agent(args),
        Command::Rejudge(args) => rejudge::rejudge(args),
        Command::Freeze(args) => freeze::freeze(args),
        Command::Variance(args) => variance::variance(args),
        Command::Lsp => lsp(),
        Command::Completions(args) => complete::completions(&args),
    }
}

/// The suites read when a command is given no path.
pub(crate) const DEFAULT_SUITES: &str = "suites";

/// Loads suites (`suites/` when no path is given).
fn load_suites(paths: &[PathBuf]) -> Result<trellis_dsl::Project, trellis_dsl::Diagnostics> {
    let default = [PathBuf::from(DEFAULT_SUITES)];
    let paths = if paths.is_empty() {
        &default[..]
    } else {
        paths
    };
    trellis_dsl::load(paths, &trellis_engine::protocol::registry::specs())
}

/// Loads suites, printing diagnostics; `None` means "exit 2".
pub fn load(paths: &[PathBuf]) -> Option<trellis_dsl::Project> {
    load_suites(paths).map_err(print_load_errors).ok()
}

/// A load's diagnostics on stderr, as every command prints them.
fn print_load_errors(diagnostics: trellis_dsl::Diagnostics) {
    // Warnings first: the errors, which stop the command, are what is read last.
    for warning in diagnostics.warnings() {
        console::errln!("{:?}", miette::Report::new(warning.clone()));
    }
    console::errln!("{:?}", miette::Report::new(diagnostics));
}

fn plan(project: &trellis_dsl::Project, select: &SelectArgs) -> Option<Plan> {
    match Plan::build(project, &select.selection()) {
        Ok(plan) => Some(plan),
        Err(e) => {
            console::errln!("{:?}", miette::Report::new(e));
            None
        }
    }
}

/// What to say when `selection` selects nothing: which draft or archived scenarios it would
/// have selected, since `--include-inactive` runs them.
fn nothing_selected(
    project: &trellis_dsl::Project,
    selection: &trellis_engine::plan::Selection,
) -> String {
    // A `for-each` over a dataset that keeps no row has no instance to select: said when
    // nothing narrowed the selection, which would otherwise be blamed.
    let unselective = selection.filters.is_empty() && selection.tags.is_empty();
    let empties = if unselective {
        project.empty_expansions.as_slice()
    } else {
        &[]
    };
    let mut empty: Vec<String> = empties
        .iter()
        .take(3)
        .map(|(id, why)| format!("scenario `{}` has no instance: {why}", id.value))
        .collect();
    if empties.len() > empty.len() {
        empty.push(format!("and {} more", empties.len() - empty.len()));
    }
    let none_written = project.suites.iter().all(|s| s.scenarios.is_empty())
        && project.empty_expansions.is_empty();
    let said = if none_written && unselective {
        // Agents, tools or providers alone: there is no selection to blame.
        "the suites hold no scenario: add a `scenario \"ID\" { user \"…\"; expect … }`".to_owned()
    } else if empty.is_empty() {
        "no scenario matches the selection".to_owned()
    } else {
        format!("no scenario matches the selection; {}", empty.join("; "))
    };
    let said = said.as_str();
    if selection.include_inactive {
        return said.to_owned();
    }
    let wider = trellis_engine::plan::Selection {
        include_inactive: true,
        ..selection.clone()
    };
    let Ok(plan) = Plan::build(project, &wider) else {
        return said.to_owned();
    };
    let inactive: Vec<String> = plan
        .scenarios
        .iter()
        .take(5)
        .map(|s| {
            let status = match s.scenario.status {
                trellis_dsl::Status::Archived => "archived",
                _ => "a draft",
            };
            format!("`{}/{}` is {status}", s.suite, s.scenario.id.value)
        })
        .collect();
    if inactive.is_empty() {
        return said.to_owned();
    }
    let more = plan.scenarios.len().saturating_sub(inactive.len());
    format!(
        "no active scenario matches the selection: {}{} (`--include-inactive` runs them)",
        inactive.join(", "),
        if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        }
    )
}

/// `trellis check --explain NODE`: the language table's entry for NODE.
fn explain(node: &str) -> u8 {
    match trellis_dsl::lang::explain::find(node) {
        Ok(spec) => {
            let text = trellis_dsl::lang::explain::explain(spec);
            console::outln!("{}", text.trim_end());
            0
        }
        // An agent setting of some protocols (`agent.request`, `agent.model`): the common
        // table does not have it, the protocols' own tables do.
        // A bare name (`request`) is looked for among the protocols' settings too, as a
        // bare name is looked for below the top level of the common table.
        Err(message) => match protocol_setting(node)
            .or_else(|| protocol_setting(&format!("agent.{}", node.trim())))
        {
            Some(text) => {
                console::outln!("{}", text.trim_end());
                0
            }
            None => {
                console::errln!("error: {message}");
                EXIT_INVALID
            }
        },
    }
}

/// `--explain agent.NAME` for a setting the agent's protocol takes: its entry in each
/// protocol that takes it (the same name may mean another thing in another protocol).
fn protocol_setting(path: &str) -> Option<String> {
    let name = path.strip_prefix("agent.")?.trim();
    let mut entries: Vec<(Vec<&str>, String)> = Vec::new();
    for protocol in trellis_engine::protocol::registry::specs() {
        let Some(spec) = protocol.settings.iter().find(|s| s.name == name) else {
            continue;
        };
        let text = trellis_dsl::lang::explain::explain(spec)
            .trim_end()
            .to_owned();
        match entries.iter_mut().find(|(_, t)| *t == text) {
            Some((owners, _)) => owners.push(protocol.name),
            None => entries.push((vec![protocol.name], text)),
        }
    }
    if entries.is_empty() {
        return None;
    }
    let shown: Vec<String> = entries
        .into_iter()
        .map(|(owners, text)| {
            let owners: Vec<String> = owners.iter().map(|o| format!("`{o}`")).collect();
            format!("agent setting of protocol {}:\n{text}", owners.join(", "))
        })
        .collect();
    Some(shown.join("\n\n"))
}

/// What `check` warns of in a project that loads (`watch` and the editor show the same).
/// `env` as `run` would see it here: a template reading an unset variable fails at run time.
pub(crate) fn project_warnings(project: &trellis_dsl::Project) -> Vec<trellis_dsl::Diagnostic> {
    let mut warnings = trellis_engine::plan::warnings(project);
    warnings.extend(trellis_dsl::validate::warnings(project, |name| {
        std::env::var(name).ok()
    }));
    // In the order they are written, file by file (the checks that find them run one after
    // the other over the whole project).
    warnings.sort_by_key(|w| (w.file.is_none(), w.file, w.offset()));
    warnings
}

fn lsp() -> u8 {
    let config = trellis_lsp::Config {
        protocols: trellis_engine::protocol::registry::specs(),
        // What `check` adds to a project that loads, as `check` computes it.
        warnings: Box::new(project_warnings),
    };
    match trellis_lsp::serve_stdio(config) {
        Ok(trellis_lsp::server::Ended::ExitedWithoutShutdown) => EXIT_FAILED,
        Ok(_) => EXIT_OK,
        Err(e) => {
            console::errln!("error: {e}");
            EXIT_INVALID
        }
    }
}

/// Validates; warns (exit 0) about what is valid but cannot run yet, with the reasons the
/// planner records when it skips them.
fn check(args: &PathArgs, json: bool) -> u8 {
    let project = match load_suites(&args.paths) {
        Ok(project) => project,
        Err(diagnostics) if json => {
            check_json::invalid(&diagnostics);
            return EXIT_INVALID;
        }
        Err(diagnostics) => {
            print_load_errors(diagnostics);
            return EXIT_INVALID;
        }
    };
    let warnings = project_warnings(&project);
    for warning in &warnings {
        if json {
            console::outln!("{}", check_json::diagnostic(warning, &project.files));
        } else {
            console::errln!("{:?}", miette::Report::new(warning.clone()));
        }
    }
    // Counted on a plan of every scenario, so the numbers are the ones a run would record.
    let everything = Selection {
        include_inactive: true,
        ..Selection::default()
    };
    let counts = match Plan::count_not_runnable(&project, &everything, Default::default()) {
        Ok(counts) => counts,
        Err(e) if json => {
            check_json::plan_error(&e, warnings.len());
            return EXIT_INVALID;
        }
        Err(e) => {
            console::errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let scenarios = project.scenarios().count();
    // Counted without listing them, as validation counts them: each scenario's graph was
    // built again only to be counted.
    let trajectories = project.scenarios().fold(0u64, |n, (_, s)| {
        n.saturating_add(TrajectoryGraph::count(s))
    });
    if json {
        console::outln!(
            "{}",
            serde_json::json!({
                "type": "summary",
                "ok": true,
                "errors": 0,
                "warnings": warnings.len(),
                "files": project.files.len(),
                "suites": project.suites.len(),
                "scenarios": scenarios,
                "trajectories": trajectories,
                "agents": project.agents.len(),
                "trajectories_not_runnable": counts.skipped_trajectories,
                "checks_skipped": counts.skipped_checks,
            })
        );
    } else {
        // Valid, but not silent: a warning above is counted here, where the eye lands.
        let warned = if warnings.is_empty() {
            String::new()
        } else {
            format!(
                "; {} above",
                console::count(warnings.len() as u64, "warning", "warnings")
            )
        };
        console::outln!(
            "ok: {}, {}, {}, {}, {}{warned}",
            console::count(project.files.len() as u64, "file", "files"),
            console::count(project.suites.len() as u64, "suite", "suites"),
            console::count(scenarios as u64, "scenario", "scenarios"),
            console::count(trajectories, "trajectory", "trajectories"),
            console::count(project.agents.len() as u64, "agent", "agents")
        );
    }
    if !json && (counts.skipped_trajectories > 0 || counts.skipped_checks > 0) {
        // Checks of the trajectories that cannot run are not counted again.
        let mut parts = Vec::new();
        if counts.skipped_trajectories > 0 {
            parts.push(format!(
                "{} of {} (per agent) cannot run yet",
                counts.skipped_trajectories,
                console::count(counts.trajectories, "trajectory run", "trajectory runs"),
            ));
        }
        if counts.skipped_checks > 0 {
            parts.push(format!(
                "{} will be skipped",
                console::count(counts.skipped_checks, "check", "checks")
            ));
        }
        console::outln!(
            "warning: {}; see the {} above",
            parts.join(" and "),
            console::count(warnings.len() as u64, "warning", "warnings")
        );
    }
    // The process exits next: a large project (a dataset's instances) is freed aside rather
    // than waited for (30 ms of checking 100,000 rows).
    if trellis_reports::is_large(scenarios) {
        trellis_reports::dispose(Box::new(project));
    }
    EXIT_OK
}

fn list(args: &ListArgs) -> u8 {
    let Some(project) = load(&args.paths.paths) else {
        return EXIT_INVALID;
    };
    let Some(plan) = plan(&project, &args.select) else {
        return EXIT_INVALID;
    };
    let fingerprinter = args
        .verbose
        .then(|| trellis_engine::fingerprint::Fingerprinter::of(&project));
    for s in &plan.scenarios {
        let agents: Vec<&str> = s.agents.iter().map(|&a| &*plan.agents[a].id).collect();
        // The agent decides at run time whether to fork: say how far that is explored.
        let forks = if s
            .agents
            .iter()
            .any(|&a| plan.agents[a].protocol.capabilities().agent_branches)
        {
            format!(
                "  agent forks: up to {} alternatives, {} deep (each runs as TRAJECTORY~ALTERNATIVE)",
                s.agent_branches.breadth, s.agent_branches.depth
            )
        } else {
            String::new()
        };
        console::outln!(
            "{}/{}  agents: {}  repeat: {}{forks}{}",
            s.suite,
            s.scenario.id.value,
            agents.join(", "),
            s.repeat,
            if s.scenario.needs.is_empty() {
                String::new()
            } else {
                format!(
                    "  needs: {}",
                    s.scenario
                        .needs
                        .iter()
                        .map(|n| n.value.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        if let Some(fingerprinter) = &fingerprinter {
            let prints = fingerprinter.scenario(&s.scenario);
            console::outln!("  fingerprint: {}  setup {}", prints.scenario, prints.setup);
            // In tree order, root first.
            for node in s.nodes.iter() {
                if let Some(print) = prints.nodes.get(&node.id) {
                    console::outln!("  node {}: {print}", node.id);
                }
            }
        }
        for t in &s.trajectories {
            // Why it will be skipped, per agent when only some agents cannot run it.
            let mut skips: Vec<String> = Vec::new();
            for &a in &s.agents {
                let agent = &plan.agents[a];
                let reason = agent
                    .unsupported
                    .as_deref()
                    .or_else(|| t.unsupported_for(agent));
                if let Some(reason) = reason {
                    let line = if s.agents.len() == 1 {
                        format!("  skipped: {reason}")
                    } else {
                        format!("  skipped on `{}`: {reason}", agent.id)
                    };
                    skips.push(line);
                }
            }
            console::outln!(
                "    {}  ({}){}",
                t.name,
                t.nodes.join(" > "),
                skips.join("")
            );
        }
    }
    console::outln!(
        "{}, {} with repetitions",
        console::count(plan.scenarios.len() as u64, "scenario", "scenarios"),
        console::count(plan.trajectory_count(), "trajectory run", "trajectory runs")
    );
    EXIT_OK
}

fn graph(args: &GraphArgs) -> u8 {
    let Some(project) = load(&args.paths.paths) else {
        return EXIT_INVALID;
    };
    let format = match args.format {
        Format::Dot => GraphFormat::Dot,
        Format::Mermaid => GraphFormat::Mermaid,
    };
    let Some(plan) = plan(&project, &args.select) else {
        return EXIT_INVALID;
    };
    if args.needs {
        // The selection, with the scenarios it needs (which the plan pulls in), and the
        // drafts and archived ones it needs, which do not run (so their dependents are
        // skipped), named as such.
        let mut names: Vec<String> = plan
            .scenarios
            .iter()
            .map(|s| format!("{}/{}", s.suite, s.scenario.id.value))
            .collect();
        let mut edges: Vec<(usize, usize)> = plan
            .scenarios
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.needs.iter().map(move |&n| (n, i)))
            .collect();
        for (i, s) in plan.scenarios.iter().enumerate() {
            for (id, status) in &s.inactive_needs {
                let name = format!("{id} ({status}, not run)");
                let n = names.iter().position(|x| *x == name).unwrap_or_else(|| {
                    names.push(name);
                    names.len() - 1
                });
                edges.push((n, i));
            }
        }
        console::out_text(&trellis_dsl::graph::render_needs_of(&names, &edges, format));
        return EXIT_OK;
    }
    let scenarios = plan
        .scenarios
        .iter()
        .map(|s| (&*s.suite, s.scenario.as_ref()));
    console::out_text(&trellis_dsl::graph::render_trajectories(scenarios, format));
    EXIT_OK
}

fn report(args: &ReportArgs) -> u8 {
    // A run directory, else a run id, prefix or name in `runs/`, as `show` and `compare`
    // take it.
    let dir = if args.dir.is_dir() {
        args.dir.clone()
    } else {
        match history::run_dir(Path::new("runs"), &args.dir.to_string_lossy()) {
            Ok(dir) => dir,
            Err(code) => return code,
        }
    };
    let out = args.out.as_deref().unwrap_or(&dir);
    // A run still writing its journal would have its files replaced under it (and then
    // fail to put its own in place): wait for it, as `--resume` and `merge` do.
    let _claims = match report_claims(&dir, out) {
        Ok(claims) => claims,
        Err(message) => {
            console::errln!("error: {message}");
            return EXIT_INVALID;
        }
    };
    let options = trellis_reports::ReportOptions::default();
    match trellis_reports::write_reports_to(&dir, out, &options) {
        Ok(files) => {
            for path in files.written() {
                console::outln!("{}", path.display());
            }
            if !files.complete && trellis_reports::history::is_watch_rerun(&dir) {
                // Watch's next save reruns it; a rerun is not resumed.
                console::outln!(
                    "note: the journal has no end: this rerun of `trellis watch` was stopped \
                     before it finished"
                );
            } else if !files.complete {
                console::outln!(
                    "note: the journal has no end: the run did not finish (`trellis run … \
                     --resume {}` finishes it)",
                    console::shell_word(&dir)
                );
            }
            if files.skipped_lines > 0 {
                console::outln!(
                    "note: {} could not be read and {} skipped",
                    console::count(files.skipped_lines as u64, "journal line", "journal lines"),
                    if files.skipped_lines == 1 {
                        "was"
                    } else {
                        "were"
                    }
                );
            }
            if files.not_written.is_empty() {
                return EXIT_OK;
            }
            console::errln!("error: results are incomplete:");
            for (path, e) in &files.not_written {
                let why = std::error::Error::source(e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                console::errln!("  - {} was not written: {e}{why}", path.display());
            }
            EXIT_INCOMPLETE
        }
        Err(e) => {
            console::errln!("{:?}", miette::Report::new(e));
            EXIT_INVALID
        }
    }
}

/// The locks `trellis report DIR [--out OUT]` holds while it writes: DIR's (no run may be
/// writing the journal it reads), and OUT's when it is another directory, which must not
/// hold a different run (its tables would then describe this one next to its own journal).
fn report_claims(dir: &Path, out: &Path) -> Result<Vec<recorder::OutClaim>, String> {
    use trellis_reports::history;
    if !dir.is_dir() {
        // Said by the report writer, with its own help.
        return Ok(Vec::new());
    }
    // The run being reported on is still being written: what to wait for is that run, not
    // this report's --out.
    let mut claims = vec![recorder::claim_run_dir(dir).map_err(|e| match e {
        recorder::ClaimError::Busy(_) => format!(
            "{} is in use by another trellis command (the run recording it, or a report \
             of it); report it once that has ended",
            dir.display()
        ),
        other => other.to_string(),
    })?];
    if !history::same_dir(dir, out) {
        if history::is_run_dir(out) {
            let id = |d: &Path| history::read_run(d).ok().map(|r| r.run_id);
            let (theirs, ours) = (id(out), id(dir));
            if theirs.is_none() || theirs != ours {
                return Err(format!(
                    "{} holds another run ({}); choose an empty --out, or remove that run \
                     first",
                    out.display(),
                    theirs.as_deref().unwrap_or("unreadable")
                ));
            }
        }
        if out.is_dir() {
            claims.push(recorder::claim_run_dir(out).map_err(|e| e.to_string())?);
        }
    }
    Ok(claims)
}

/// `runs/<run-id>` relative to the working directory.
pub fn default_out_dir(run_id: &str) -> PathBuf {
    Path::new("runs").join(run_id)
}
