//! GitHub Actions: when a run is a step of a workflow, its failures and the gate's verdict
//! as the annotations GitHub draws on the pull request (workflow commands, `::error`), and a
//! summary of the run in the job's page (`$GITHUB_STEP_SUMMARY`). Outside a workflow
//! (`GITHUB_ACTIONS` is not `true`, no summary file) nothing here runs or costs anything.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use trellis_engine::plan::Plan;
use trellis_reports::compare::{Comparison, Verdict};
use trellis_reports::stats::{CriterionStats, RunStats};

/// Annotations of one step GitHub shows at most of each kind (10 errors): more are dropped
/// by it, so more are not written.
const MAX_ANNOTATIONS: usize = 10;

/// Lines of a list the summary shows at most; the rest are counted.
const MAX_LISTED: usize = 20;

/// Where each scenario is written, to place its annotation: taken from the plan and the
/// suites' files before they are let go, only inside a workflow.
pub struct Locations {
    /// Each scenario's file (from the repository's root) and line.
    at: HashMap<(String, String), (PathBuf, usize)>,
    /// Each placed scenario's model and the index of its file, to place its checks.
    models: HashMap<(String, String), (Arc<trellis_dsl::Scenario>, usize)>,
    files: Vec<trellis_dsl::SourceFile>,
}

impl Locations {
    pub fn of(plan: &Plan, project: &trellis_dsl::Project) -> Option<Self> {
        let planned = plan.scenarios.iter().map(|s| (&*s.suite, &s.scenario));
        Locations::of_scenarios(project, planned)
    }

    /// Every scenario of `project`, for results recorded elsewhere (`trellis merge`); `None`
    /// for no project: the annotations then name no file.
    pub fn of_project(project: Option<&trellis_dsl::Project>) -> Option<Self> {
        let Some(project) = project else {
            return wanted().then(|| Locations {
                at: HashMap::new(),
                models: HashMap::new(),
                files: Vec::new(),
            });
        };
        let all = project.suites.iter().flat_map(|suite| {
            suite
                .scenarios
                .iter()
                .map(move |sc| (suite.name.as_str(), sc))
        });
        Locations::of_scenarios(project, all)
    }

    fn of_scenarios<'a>(
        project: &trellis_dsl::Project,
        scenarios: impl Iterator<Item = (&'a str, &'a Arc<trellis_dsl::Scenario>)>,
    ) -> Option<Self> {
        if !wanted() {
            return None;
        }
        let mut at = HashMap::new();
        let mut models = HashMap::new();
        let cwd = std::env::current_dir().ok();
        let root = repository_root(cwd.as_deref());
        // Each file's path from the root, found once: a file holds many scenarios (a
        // dataset's thousands of instances), and finding it resolves links on disk.
        let mut from_root_of: HashMap<usize, Option<PathBuf>> = HashMap::new();
        for (suite, scenario) in scenarios {
            let span = scenario.id.span;
            let Some(file) = project.files.get(span.file) else {
                continue;
            };
            // GitHub places an annotation by a path from the repository's root
            // ($GITHUB_WORKSPACE), whatever the step's `working-directory`. A file outside
            // the repository (suites in /tmp, another checkout) has no path GitHub can
            // place: its annotation names no file, as one on the job.
            let path = from_root_of.entry(span.file).or_insert_with(|| {
                let absolute = match &cwd {
                    Some(cwd) if file.path.is_relative() => cwd.join(&file.path),
                    _ => file.path.clone(),
                };
                root.as_ref().and_then(|root| root.path_of(&absolute))
            });
            let Some(path) = path.clone() else {
                continue;
            };
            let (line, _) = file.line_col(span.span.offset());
            let key = (suite.to_owned(), scenario.id.value.clone());
            models.insert(key.clone(), (Arc::clone(scenario), span.file));
            at.insert(key, (path, line));
        }
        Some(Locations {
            at,
            models,
            files: project.files.clone(),
        })
    }

    fn of_scenario(&self, suite: &str, scenario: &str) -> Option<&(PathBuf, usize)> {
        self.at.get(&(suite.to_owned(), scenario.to_owned()))
    }

    /// Where check `c` is written: its file, line and column, when it is in its scenario's
    /// file (a scenario's checks are, but for a `criteria-override` of another file).
    fn of_check(&self, c: &CriterionStats) -> Option<(&Path, usize, usize)> {
        let key = (c.suite.to_string(), c.scenario.to_string());
        let (path, _) = self.at.get(&key)?;
        let (model, file) = self.models.get(&key)?;
        let span = model
            .checks_written_as(&c.trajectory, c.turn_index, &c.criterion)
            .first()?
            .span;
        if span.file != *file {
            return None;
        }
        let (line, column) = self.files.get(span.file)?.line_col(span.span.offset());
        Some((path, line, column))
    }
}

/// The directory annotations' paths start from: the repository's checkout
/// (`$GITHUB_WORKSPACE`), else the current directory; with its links resolved once.
struct Root {
    given: PathBuf,
    resolved: Option<PathBuf>,
}

fn repository_root(cwd: Option<&Path>) -> Option<Root> {
    let given = std::env::var_os("GITHUB_WORKSPACE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| cwd.map(Path::to_path_buf))?;
    let resolved = given.canonicalize().ok();
    Some(Root { given, resolved })
}

impl Root {
    /// `path` from the root, with `..` and links resolved (`--suites ../evals`, a workspace
    /// reached through a symbolic link); `None` for a file outside it.
    fn path_of(&self, path: &Path) -> Option<PathBuf> {
        let inside = match (&self.resolved, path.canonicalize()) {
            (Some(root), Ok(path)) => path.strip_prefix(root).map(Path::to_path_buf),
            _ => path.strip_prefix(&self.given).map(Path::to_path_buf),
        };
        inside.ok()
    }
}

/// Whether a run's results go to a workflow at all (annotations, the job summary).
pub fn wanted() -> bool {
    in_a_workflow() || summary_file().is_some()
}

fn in_a_workflow() -> bool {
    std::env::var_os("GITHUB_ACTIONS").is_some_and(|v| v == "true")
}

fn summary_file() -> Option<PathBuf> {
    std::env::var_os("GITHUB_STEP_SUMMARY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// What a run ended with, for the workflow: annotations on stdout (stderr under
/// `--message-format json`, whose stdout is the event stream), and the job summary appended
/// to. A summary that cannot be written is said, and changes nothing else.
pub fn report(
    locations: &Locations,
    stats: &RunStats,
    out: &Path,
    comparison: Option<(&str, &Comparison)>,
    json: bool,
) {
    if in_a_workflow() {
        let lines = annotations(locations, stats, comparison);
        if !lines.is_empty() {
            let text = lines.join("\n") + "\n";
            // A reader gone (`| head`) is no reason to fail the run.
            let _ = if json {
                std::io::stderr().write_all(text.as_bytes())
            } else {
                std::io::stdout().write_all(text.as_bytes())
            };
        }
    }
    if let Some(path) = summary_file() {
        let text = summary(stats, out, comparison);
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = written {
            super::console::errln!(
                "warning: cannot append the job summary to {} (GITHUB_STEP_SUMMARY): {e}",
                path.display()
            );
        }
    }
}

/// `::error` lines: under a baseline, the gate's verdict and each scenario that regressed,
/// was not run, or is new and failing (what fails the gate; failures the baseline shares
/// are not the change's); without one, each scenario that failed or errored.
fn annotations(
    locations: &Locations,
    stats: &RunStats,
    comparison: Option<(&str, &Comparison)>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let place = |suite: &str, scenario: &str| match locations.of_scenario(suite, scenario) {
        Some((path, line)) => format!(
            "file={},line={line},",
            property(&path.display().to_string())
        ),
        None => String::new(),
    };
    match comparison {
        Some((baseline, c)) => {
            if c.regressed {
                lines.push(format!(
                    "::error title={}::{}",
                    property("Trellis gate"),
                    data(&format!(
                        "{} against the baseline {baseline}; the first: {}",
                        count(c.regressions.len(), "regression", "regressions"),
                        c.regressions
                            .first()
                            .map(String::as_str)
                            .unwrap_or_default()
                    ))
                ));
            }
            for s in c
                .scenarios
                .iter()
                .filter(|s| {
                    matches!(s.rate.verdict, Verdict::Regressed | Verdict::NotRun)
                        || new_and_failing(s)
                })
                .take(MAX_ANNOTATIONS.saturating_sub(lines.len()))
            {
                let (what, title) = match &s.not_run {
                    Some(why) => (format!("not run: {why}"), "regressed"),
                    None if s.rate.verdict == Verdict::Added => (
                        format!(
                            "new in the head run, and failing: {}{}",
                            s.rate
                                .head
                                .map(|h| format!("{}/{} passed", h.passed, h.samples))
                                .unwrap_or_default(),
                            first_failure(stats, &s.suite, &s.scenario, &s.agent)
                                .map(|f| format!("; {f}"))
                                .unwrap_or_default()
                        ),
                        "new and failing",
                    ),
                    None => (trellis_reports::compare::describe(&s.rate), "regressed"),
                };
                lines.push(format!(
                    "::error {}title={}::{}",
                    place(&s.suite, &s.scenario),
                    property(&format!("{}/{} [{}] {title}", s.suite, s.scenario, s.agent)),
                    data(&what)
                ));
            }
            for (s, latency) in c
                .scenarios
                .iter()
                .filter_map(|s| Some((s, s.latency.as_ref()?)))
                .filter(|(_, l)| l.verdict == Verdict::Regressed)
                .take(MAX_ANNOTATIONS.saturating_sub(lines.len()))
            {
                lines.push(format!(
                    "::error {}title={}::{}",
                    place(&s.suite, &s.scenario),
                    property(&format!("{}/{} [{}] slower", s.suite, s.scenario, s.agent)),
                    data(&mean_turn_said(
                        s.base_latency_mean_ms,
                        s.head_latency_mean_ms,
                        latency.why.as_deref()
                    ))
                ));
            }
            // Worse than the baseline by too little to tell from chance: it passes the gate,
            // and a warning on the pull request says so, where only the job summary did (a
            // scenario flaky enough to fail half the time can fall short of the test at a
            // low `repeat`).
            for s in c
                .scenarios
                .iter()
                .filter(|s| {
                    s.rate.verdict == Verdict::Noise && s.rate.delta_points.is_some_and(|d| d < 0.0)
                })
                .take(MAX_ANNOTATIONS.saturating_sub(lines.len()))
            {
                lines.push(format!(
                    "::warning {}title={}::{}",
                    place(&s.suite, &s.scenario),
                    property(&format!(
                        "{}/{} [{}] worse (within chance)",
                        s.suite, s.scenario, s.agent
                    )),
                    data(&format!(
                        "{}; a higher `repeat` tells a real drop from chance",
                        gate_note(&s.rate).unwrap_or_default()
                    ))
                ));
            }
            // A latency rise the gate let through as noise: on the pull request, as a pass
            // rate's drop within chance is (only the console and compare.json said it).
            for (whose, why) in latency_noise(c) {
                if lines.len() >= MAX_ANNOTATIONS {
                    break;
                }
                let (place, whose) = match whose {
                    Whose::Run(whose) => (String::new(), whose),
                    Whose::Scenario(s) => (
                        place(&s.suite, &s.scenario),
                        format!("{}/{} [{}]", s.suite, s.scenario, s.agent),
                    ),
                };
                lines.push(format!(
                    "::warning {place}title={}::{}",
                    property(&format!("{whose} slower (within noise)")),
                    data(&why)
                ));
            }
            if let Some(what) = c
                .taken_out
                .as_ref()
                .filter(|_| lines.len() < MAX_ANNOTATIONS)
            {
                lines.push(format!(
                    "::warning title={}::{}",
                    property("Trellis gate"),
                    data(what)
                ));
            }
        }
        None => {
            let place_check = |c: &CriterionStats| {
                locations.of_check(c).map(|(path, line, column)| {
                    format!(
                        "file={},line={line},col={column},",
                        property(&path.display().to_string())
                    )
                })
            };
            if let Some(why) = nothing_checked(stats) {
                lines.push(format!(
                    "::warning title={}::{}",
                    property("Trellis run checked nothing"),
                    data(&why)
                ));
            }
            for s in stats
                .scenarios
                .iter()
                .filter(|s| s.counts.failed + s.counts.errors > 0)
                .take(MAX_ANNOTATIONS)
            {
                let check = first_failed_check(stats, &s.suite, &s.scenario, &s.agent);
                let first = check
                    .map(said_of)
                    .or_else(|| s.first_fault.as_deref().map(cut_short));
                // At the failed check's line, else the scenario's (a fault, a check whose
                // place cannot be told).
                let at = check
                    .and_then(place_check)
                    .unwrap_or_else(|| place(&s.suite, &s.scenario));
                lines.push(format!(
                    "::error {}title={}::{}",
                    at,
                    property(&format!("{}/{} [{}] failed", s.suite, s.scenario, s.agent)),
                    data(&format!(
                        "{}{}",
                        outcome(&s.counts),
                        first.map(|f| format!("; {f}")).unwrap_or_default()
                    ))
                ));
            }
        }
    }
    lines
}

/// Why a run that nothing failed is no pass either: not one trajectory passed, failed or
/// errored (the console's `warning: nothing was checked`).
fn nothing_checked(stats: &RunStats) -> Option<String> {
    let c = &stats.aggregates.counts;
    (c.trajectories > 0 && c.passed + c.failed + c.errors == 0).then(|| {
        format!(
            "none of the run's {} passed or failed ({} skipped, {} invalid): the exit code 0 \
             says only that nothing failed",
            count(c.trajectories as usize, "trajectory", "trajectories"),
            c.skipped,
            c.invalid
        )
    })
}

/// `mean turn 61 ms → 180 ms: WHY`.
fn mean_turn_said(base: Option<f64>, head: Option<f64>, why: Option<&str>) -> String {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.0} ms")).unwrap_or_default();
    format!(
        "mean turn {} → {}: {}",
        ms(base),
        ms(head),
        why.unwrap_or_default()
    )
}

/// Whose latency rose past the thresholds but was let through as noise.
enum Whose<'c> {
    /// The run's (`run`) or an agent's (`agent NAME`).
    Run(String),
    Scenario(&'c trellis_reports::compare::ScenarioChange),
}

/// Each latency the gate let through as `noise` though it rose, with why, run and agents
/// first.
fn latency_noise(c: &Comparison) -> Vec<(Whose<'_>, String)> {
    let mut out = Vec::new();
    for m in c.metrics.iter().filter(|m| {
        m.metric == "latency_mean_ms"
            && m.verdict == Verdict::Noise
            && m.delta.is_some_and(|d| d > 0.0)
    }) {
        let whose = match &m.agent {
            Some(agent) => format!("agent {agent}"),
            None => "run".to_owned(),
        };
        out.push((
            Whose::Run(whose),
            mean_turn_said(m.base, m.head, m.why.as_deref()),
        ));
    }
    for s in &c.scenarios {
        if let Some(l) = s.latency.as_ref().filter(|l| l.verdict == Verdict::Noise) {
            out.push((
                Whose::Scenario(s),
                mean_turn_said(
                    s.base_latency_mean_ms,
                    s.head_latency_mean_ms,
                    l.why.as_deref(),
                ),
            ));
        }
    }
    out
}

/// The job summary: counts, the gate's verdict and regressions, the failing scenarios, and
/// where the results are.
fn summary(stats: &RunStats, out: &Path, comparison: Option<(&str, &Comparison)>) -> String {
    let c = &stats.aggregates.counts;
    let mut text = String::new();
    let _ = writeln!(text, "### Trellis run `{}`\n", code(&stats.run_id));
    let _ = writeln!(
        text,
        "| trajectories | passed | failed | errors | skipped | invalid |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n| {} | {} | {} | {} | {} | {} |\n",
        c.trajectories, c.passed, c.failed, c.errors, c.skipped, c.invalid
    );
    if let Some(why) = trellis_reports::compare::incomplete(stats) {
        let _ = writeln!(text, "**The run {why}.**\n");
    }
    if let Some(why) = nothing_checked(stats) {
        let _ = writeln!(text, "**Nothing was checked:** {}.\n", markdown(&why));
    }
    if let Some((baseline, comparison)) = comparison {
        if comparison.regressed {
            let _ = writeln!(
                text,
                "**Gate: regressed** against the baseline `{}` ({}):\n",
                code(baseline),
                count(comparison.regressions.len(), "regression", "regressions")
            );
            for r in comparison.regressions.iter().take(MAX_LISTED) {
                let _ = writeln!(text, "- {}", markdown(r));
            }
            if comparison.regressions.len() > MAX_LISTED {
                let _ = writeln!(
                    text,
                    "- and {} more (`compare.json`)",
                    comparison.regressions.len() - MAX_LISTED
                );
            }
            text.push('\n');
        } else {
            let _ = writeln!(
                text,
                "**Gate: no regression** against the baseline `{}`.\n",
                code(baseline)
            );
        }
        let noise = latency_noise(comparison);
        if !noise.is_empty() {
            let _ = writeln!(text, "Slower, but within the latency gate's noise:\n");
            for (whose, why) in noise.iter().take(MAX_LISTED) {
                let whose = match whose {
                    Whose::Run(whose) => whose.clone(),
                    Whose::Scenario(s) => format!(
                        "`{}` [{}]",
                        code(&format!("{}/{}", s.suite, s.scenario)),
                        code(&s.agent)
                    ),
                };
                let _ = writeln!(text, "- {whose}: {}", markdown(why));
            }
            if noise.len() > MAX_LISTED {
                let _ = writeln!(
                    text,
                    "- and {} more (`compare.json`)",
                    noise.len() - MAX_LISTED
                );
            }
            text.push('\n');
        }
        // Fewer checks than the baseline's pass the gate by default: a reviewer is told
        // which, where they look, rather than only the console.
        if let Some(what) = &comparison.taken_out {
            let _ = writeln!(text, "**Note:** {}.\n", markdown(what));
            let removed: Vec<_> = comparison
                .scenarios
                .iter()
                .filter(|s| s.rate.verdict == Verdict::Removed)
                .collect();
            for s in removed.iter().take(MAX_LISTED) {
                let _ = writeln!(
                    text,
                    "- `{}` [{}]: checked in the baseline, not in this run",
                    code(&format!("{}/{}", s.suite, s.scenario)),
                    code(&s.agent)
                );
            }
            if removed.len() > MAX_LISTED {
                let _ = writeln!(
                    text,
                    "- and {} more (`compare.json`)",
                    removed.len() - MAX_LISTED
                );
            }
            if !removed.is_empty() {
                text.push('\n');
            }
        }
    }
    let failing: Vec<_> = stats
        .scenarios
        .iter()
        .filter(|s| s.counts.failed + s.counts.errors > 0)
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(text, "Scenarios that failed or errored:\n");
        for s in failing.iter().take(MAX_LISTED) {
            let first = first_failure(stats, &s.suite, &s.scenario, &s.agent)
                .or_else(|| s.first_fault.as_deref().map(cut_short));
            // Under a baseline, what the gate made of it: a failure the baseline shares, or
            // one too few to tell from chance, passes the gate, and says so.
            let gate = comparison
                .and_then(|(_, c)| {
                    c.scenarios.iter().find(|g| {
                        *g.suite == *s.suite && *g.scenario == *s.scenario && *g.agent == *s.agent
                    })
                })
                .and_then(|g| gate_note(&g.rate))
                .map(|note| format!(" ({note})"))
                .unwrap_or_default();
            let _ = writeln!(
                text,
                "- `{}/{}` [{}]: {}{gate}{}",
                code(&s.suite),
                code(&s.scenario),
                markdown(&s.agent),
                outcome(&s.counts),
                first
                    .map(|f| format!(": {}", markdown(&f)))
                    .unwrap_or_default()
            );
        }
        if failing.len() > MAX_LISTED {
            let _ = writeln!(
                text,
                "- and {} more (`trajectories.parquet`)",
                failing.len() - MAX_LISTED
            );
        }
        text.push('\n');
    }
    let _ = writeln!(
        text,
        "Results in `{}`: `report.html`, `junit.xml`, the Parquet tables{}.\n",
        code(&out.display().to_string()),
        if comparison.is_some() {
            ", `compare.html`"
        } else {
            ""
        }
    );
    text
}

/// `2 of 3 failed, 1 error`.
fn outcome(c: &trellis_reports::stats::StatusCounts) -> String {
    let mut parts = Vec::new();
    if c.failed > 0 {
        parts.push(format!("{} of {} failed", c.failed, c.trajectories));
    }
    if c.errors > 0 {
        parts.push(if c.failed > 0 {
            count(c.errors as usize, "error", "errors")
        } else {
            format!("{} of {} ended in an error", c.errors, c.trajectories)
        });
    }
    parts.join(", ")
}

/// Whether the gate fails a scenario for being new: it was not in the baseline, and did
/// not pass every time (as `trellis_reports::compare` counts it among the regressions).
fn new_and_failing(s: &trellis_reports::compare::ScenarioChange) -> bool {
    s.rate.verdict == Verdict::Added && s.rate.head.is_some_and(|h| h.passed < h.samples)
}

/// What the gate made of a failing scenario that did not fail it.
fn gate_note(rate: &trellis_reports::compare::RateChange) -> Option<String> {
    let change = trellis_reports::compare::describe(rate);
    match rate.verdict {
        Verdict::Unchanged => Some(format!("as in the baseline: {change}")),
        Verdict::Improved => Some(format!("better than the baseline: {change}")),
        // Noise either way: a rise the test cannot tell from chance is noise too.
        Verdict::Noise if rate.delta_points.is_some_and(|d| d > 0.0) => Some(format!(
            "better than the baseline, but within chance: {change}"
        )),
        Verdict::Noise => Some(format!(
            "worse than the baseline, but within chance: {change}"
        )),
        Verdict::Regressed | Verdict::NotRun => Some(format!("regressed: {change}")),
        Verdict::Added => Some("new in the head run".to_owned()),
        Verdict::Removed | Verdict::NotComparable | Verdict::Ungated => None,
    }
}

/// The first failed (or erred) check of a scenario and why, cut short.
fn first_failure(stats: &RunStats, suite: &str, scenario: &str, agent: &str) -> Option<String> {
    first_failed_check(stats, suite, scenario, agent).map(said_of)
}

/// The first check of a scenario's agent that failed or errored.
fn first_failed_check<'s>(
    stats: &'s RunStats,
    suite: &str,
    scenario: &str,
    agent: &str,
) -> Option<&'s CriterionStats> {
    stats.criteria.iter().find(|c| {
        c.failed + c.errors > 0
            && *c.suite == *suite
            && *c.scenario == *scenario
            && *c.agent == *agent
    })
}

/// `CHECK: why it failed`, cut short.
fn said_of(c: &CriterionStats) -> String {
    let why = c
        .first_failure
        .as_deref()
        .unwrap_or(if c.failed > 0 { "failed" } else { "error" });
    cut_short(&format!("{}: {why}", c.criterion))
}

/// `text`, at most 300 characters of it.
fn cut_short(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A workflow command's message: `%`, CR and LF escaped, as the runner reads them, and any
/// other control character written as an escape (`\u{1b}`): an agent's error body quoted in
/// a fault would otherwise put terminal escapes in the log and NUL bytes in the job's page.
fn data(text: &str) -> String {
    visible(text, &['\n', '\r', '\t'])
        .replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value: as [`data`], and `:` and `,` too.
fn property(text: &str) -> String {
    data(text).replace(':', "%3A").replace(',', "%2C")
}

/// Text inside a Markdown code span: a backtick would close it; control characters
/// written as escapes.
fn code(text: &str) -> String {
    visible(text, &[]).replace('`', "'")
}

/// `text` with every control character but `kept` written as an escape (`\u{1b}`).
fn visible<'a>(text: &'a str, kept: &[char]) -> std::borrow::Cow<'a, str> {
    trellis_engine::record::shown::visible_controls_but(text, kept)
}

/// Text in a Markdown line: on one line, with what would start markup or HTML escaped.
/// The code spans it quotes (`` `check_service_area` ``) are kept as spans, their text as
/// it is: escapes do not apply inside one, and `check\_service\_area` showed the
/// backslashes. A backtick that closes no span is escaped.
fn markdown(text: &str) -> String {
    let text = visible(text, &['\n', '\r']);
    let pieces: Vec<&str> = text.split('`').collect();
    let mut out = String::with_capacity(text.len());
    // Odd pieces are between two backticks; the last is not when it has no closing one,
    // and an empty one would make its two backticks one span's opening.
    let spanned = |j: usize| j % 2 == 1 && j + 1 < pieces.len() && !pieces[j].is_empty();
    for (i, piece) in pieces.iter().enumerate() {
        // The backtick before piece `i` opens it (odd `i`) or closes the piece before.
        if i > 0 {
            let delimits = if i % 2 == 1 {
                spanned(i)
            } else {
                spanned(i - 1)
            };
            out.push_str(if delimits { "`" } else { "\\`" });
        }
        if spanned(i) {
            out.extend(
                piece
                    .chars()
                    .map(|c| if matches!(c, '\n' | '\r') { ' ' } else { c }),
            );
            continue;
        }
        for ch in piece.chars() {
            match ch {
                '\n' | '\r' => out.push(' '),
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '&' => out.push_str("&amp;"),
                '\\' | '*' | '_' | '[' | ']' | '|' | '#' => {
                    out.push('\\');
                    out.push(ch);
                }
                c => out.push(c),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A latency rise the gate let through as noise (the run's, and a scenario's) is a
    /// warning on the pull request and a line of the job summary, not only the console's.
    #[test]
    fn latency_let_through_as_noise_is_a_warning_and_in_the_summary() {
        let run = |id: &str| {
            serde_json::json!({"run_id": id, "name": null, "dir": id,
            "started_at": "2026-12-06T00:00:00Z", "finished": true, "stopped": false})
        };
        let rate = serde_json::json!({"base": {"passed": 3, "samples": 3},
            "head": {"passed": 3, "samples": 3}, "delta_points": 0.0, "p_value": null,
            "verdict": "unchanged"});
        let comparison: Comparison = serde_json::from_value(serde_json::json!({
            "base": run("b"), "head": run("h"),
            "thresholds": {"max_pass_rate_drop": 0.0, "max_score_drop": 5.0,
                "max_latency_increase_pct": 20.0, "latency_noise_ms": 25.0, "alpha": 0.05,
                "gate_untrusted_judges": false, "gate_removed": false},
            "metrics": [{"metric": "latency_mean_ms", "base": 79.0, "head": 118.0,
                "delta": 39.0, "threshold": 20.0, "p_value": 0.0001, "verdict": "noise",
                "why": "mean +39 ms (+50%); but the median turn moved +25 ms"}],
            "scenarios": [{"suite": "bot", "scenario": "order", "agent": "bot", "rate": rate,
                "base_latency_mean_ms": 60.0, "head_latency_mean_ms": 102.0,
                "latency": {"verdict": "noise", "why": "its turns are 1.70× the base's"}}],
            "branches": [], "criteria": [], "regressions": [], "regressed": false,
            "untrusted_judges": [], "score_gate_refused": null
        }))
        .unwrap();
        let lines = annotations(
            &Locations {
                at: HashMap::new(),
                models: HashMap::new(),
                files: Vec::new(),
            },
            &RunStats::default(),
            Some(("b", &comparison)),
        );
        assert_eq!(
            lines,
            [
                "::warning title=run slower (within noise)::mean turn 79 ms → 118 ms: mean +39 \
                 ms (+50%25); but the median turn moved +25 ms",
                "::warning title=bot/order [bot] slower (within noise)::mean turn 60 ms → 102 \
                 ms: its turns are 1.70× the base's",
            ]
        );
        let text = summary(
            &RunStats::default(),
            Path::new("out"),
            Some(("b", &comparison)),
        );
        assert!(
            text.contains("Slower, but within the latency gate's noise:\n\n- run: mean turn"),
            "{text}"
        );
        assert!(
            text.contains("- `bot/order` [bot]: mean turn 60 ms"),
            "{text}"
        );
    }

    /// A rise too small to tell from chance is noise too: said as better, not as worse.
    #[test]
    fn a_gate_note_says_which_way_a_change_within_chance_went() {
        use trellis_reports::compare::{RateChange, Tally};
        let rate = |base: u64, head: u64| RateChange {
            base: Some(Tally {
                passed: base,
                samples: 3,
            }),
            head: Some(Tally {
                passed: head,
                samples: 3,
            }),
            delta_points: Some((head as f64 - base as f64) * 100.0 / 3.0),
            p_value: Some(0.5),
            verdict: Verdict::Noise,
        };
        let up = gate_note(&rate(1, 2)).unwrap_or_default();
        assert!(
            up.starts_with("better than the baseline, but within chance"),
            "{up}"
        );
        let down = gate_note(&rate(3, 2)).unwrap_or_default();
        assert!(
            down.starts_with("worse than the baseline, but within chance"),
            "{down}"
        );
    }

    #[test]
    fn workflow_command_values_are_escaped_as_the_runner_reads_them() {
        assert_eq!(data("50% done\nnext\r"), "50%25 done%0Anext%0D");
        assert_eq!(property("a:b,c%"), "a%3Ab%2Cc%25");
        assert_eq!(markdown("a|b *c* <x>\nd"), "a\\|b \\*c\\* &lt;x&gt; d");
        // A code span's text is as it is (escapes do not apply in one); a backtick that
        // closes none is escaped, and what follows it is escaped as text.
        assert_eq!(
            markdown("check_a `tool \"check_area\"`: `<b>` was called"),
            "check\\_a `tool \"check_area\"`: `<b>` was called"
        );
        assert_eq!(markdown("a `b_c"), "a \\`b\\_c");
        assert_eq!(markdown("a `` <b>"), "a \\`\\` &lt;b&gt;");
        assert_eq!(markdown("`x`_`<y>"), "`x`\\_\\`&lt;y&gt;");
        // An agent's bytes: escapes, a terminal title, a NUL, written visibly.
        let hostile = "\u{1b}[31mred\u{1b}]0;pwned\u{7}\0end";
        for shown in [data(hostile), markdown(hostile), code(hostile)] {
            assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        }
        assert_eq!(data("a\u{1b}b\tc"), "a\\u{1b}b\tc");
        assert_eq!(code("a`b"), "a'b");
    }
}
