//! `junit.xml`: one test suite per Trellis suite, one test case per trajectory and
//! repetition, for CI systems that display JUnit results.
//!
//! A case's `time` is its trajectory's own duration. A suite's `time` is its wall time, from
//! its first agent call to the end of its last one: trajectories run concurrently and share
//! prefixes, so the sum of their durations would overstate it many times over.
//!
//! Written as trajectories stream by: each suite's test cases go to an anonymous temporary
//! file, and [`JunitBuilder::write`] puts the header with the totals (which JUnit wants
//! before the cases) in front of them. Memory stays flat however many trajectories a run
//! has, which an in-memory report (such as `quick-junit`'s) cannot offer: what is kept per
//! case is its place in the plan and where its XML lies in the file (40 bytes, and as much
//! again for a moment while they are sorted at the end: 80 MB for two million cases).
//!
//! Cases are written in the plan's order (scenario, agent, repetition, branch; a simulated
//! user's retries after their first attempt, by number; an agent's forks after what they
//! fork from, by name), as the report and the console list them, not in the order they
//! finished: two runs of the same suites give files that differ only where their results do.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{self, BufRead as _, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use trellis_records::{CriterionStatus, NodeRecord, RunInfo, TrajectoryRecord, TrajectoryStatus};

use crate::error::ReportError;
use crate::positions::{Positions, SCANNED};
use crate::staged::Staged;

pub(crate) struct JunitBuilder {
    run_id: String,
    /// Suites in the run's load order; suites the run did not announce are appended.
    suites: Vec<SuitePart>,
    /// Each planned scenario's index in `RunInfo::scenarios`, by a hash of its suite and
    /// id: a hash rather than the names, which a dataset run has tens of thousands of. A
    /// hash that two scenarios share is checked against the names and only costs the
    /// second its place in the order.
    ranks: HashMap<u64, u32, foldhash::fast::RandomState>,
    /// The suffixes of the forks' and retries' names, each with its id (from 1): the cases
    /// of one place are ordered by them, so that forks come in the same order in every run.
    suffixes: HashMap<Box<str>, u32, foldhash::fast::RandomState>,
    wide: WideScenarios,
    /// Where the suites' cases are spilled as they finish: the run's own directory, not
    /// TMPDIR, which may not exist or be another, smaller file system (the cases of a big
    /// run are as large as the file).
    spill_dir: PathBuf,
}

/// The suite named `name` of `suites`, added when the run did not announce it.
fn suite_in<'s>(suites: &'s mut Vec<SuitePart>, name: &str) -> &'s mut SuitePart {
    let index = match suites.iter().position(|s| s.name == name) {
        Some(i) => i,
        None => {
            suites.push(SuitePart::new(name));
            suites.len() - 1
        }
    };
    &mut suites[index]
}

/// foldhash, as for the statistics' names (`stats::Interner`): names come from the suites,
/// and std's SipHash was most of what finding a case's place cost.
fn scenario_key(suite: &str, scenario: &str) -> u64 {
    foldhash::fast::FixedState::default().hash_one((suite, scenario))
}

/// A case's place in the plan. A retry or an agent's fork comes after the trajectory it
/// comes from, by its name's suffix; cases the plan does not name (a journal without the
/// plan) come after those it does, in the order they finished.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    scenario: u32,
    agent: u32,
    repetition: u32,
    trajectory: u32,
    /// A simulated user's retry (`@retry2`): 2; 0 for the first attempt.
    attempt: u32,
    /// 0 for the planned trajectory or its retry; else the rest of its name (an agent's
    /// forks, `~refund`; an attack's path, `~a1-2`) as an id of
    /// [`JunitBuilder::suffixes`], made that text's rank before sorting.
    suffix: u32,
}

impl Place {
    /// The case's place, and the rest of its name past its planned trajectory and retry.
    fn of<'t>(
        t: &'t TrajectoryRecord,
        info: &RunInfo,
        ranks: &HashMap<u64, u32, foldhash::fast::RandomState>,
        wide: &mut WideScenarios,
    ) -> (Place, Option<&'t str>) {
        let planned = ranks
            .get(&scenario_key(&t.suite, &t.scenario))
            .and_then(|&rank| Some((rank, info.scenarios.get(rank as usize)?)))
            .filter(|(_, s)| s.suite == t.suite && s.scenario == t.scenario);
        let Some((scenario, planned)) = planned else {
            let unplanned = Place {
                scenario: u32::MAX,
                agent: u32::MAX,
                repetition: u32::MAX,
                trajectory: u32::MAX,
                attempt: 0,
                suffix: 0,
            };
            return (unplanned, None);
        };
        let index = |i: Option<usize>| i.map_or(u32::MAX, |i| u32::try_from(i).unwrap_or(u32::MAX));
        let base = t.planned_name();
        // What the run added to the planned name: `@retryN` first, then forks and an
        // attack's path (`TrajectoryRecord::planned_name` takes them off in that order).
        let added = t.trajectory.get(base.len()..).unwrap_or_default();
        let (attempt, rest) = match added.strip_prefix("@retry") {
            Some(retry) => {
                let digits = retry.bytes().take_while(u8::is_ascii_digit).count();
                let attempt = retry[..digits].parse().unwrap_or(u32::MAX);
                (attempt, &retry[digits..])
            }
            None => (0, added),
        };
        let place = Place {
            scenario,
            agent: index(planned.agents.iter().position(|a| *a == t.agent)),
            repetition: t.repetition,
            trajectory: index(wide.position(scenario, &planned.trajectories, base)),
            attempt,
            suffix: 0,
        };
        (place, (!rest.is_empty()).then_some(rest))
    }
}

/// Position maps of the scenarios with more than [`SCANNED`] trajectories.
#[derive(Default)]
struct WideScenarios(HashMap<u32, Positions>);

impl WideScenarios {
    fn position(&mut self, scenario: u32, names: &[String], name: &str) -> Option<usize> {
        if names.len() <= SCANNED {
            return names.iter().position(|n| n == name);
        }
        self.0
            .entry(scenario)
            .or_insert_with(|| Positions::of(names.iter().map(String::as_str)))
            .get(name)
    }
}

/// Where one case's XML lies in its suite's spill file.
#[derive(Clone, Copy)]
struct CaseAt {
    place: Place,
    offset: u64,
    len: u32,
}

#[derive(Default)]
struct Counts {
    tests: u64,
    failures: u64,
    errors: u64,
    skipped: u64,
    seconds: f64,
}

struct SuitePart {
    name: String,
    counts: Counts,
    /// First start and last end of an agent call, in ms since the run started.
    span: Option<(f64, f64)>,
    /// The `<testcase>` elements written so far, in the order they finished; created on
    /// the first case.
    cases: Option<BufWriter<File>>,
    /// Where each of them lies in `cases`, in the same order.
    index: Vec<CaseAt>,
    /// Bytes written to `cases`.
    written: u64,
}

/// A suite's cases finished out of the plan's order are read back from their spill file a
/// window of this many bytes at a time (see [`copy_in_plan_order`]).
const REORDER_WINDOW: u64 = 1 << 20;

/// When windows would read the file this many times over (scenarios that ran side by side
/// interleave their cases, and the plan's order reads one scenario's at a time), the file
/// is read back whole instead, up to [`REORDER_IN_MEMORY`] bytes.
const WINDOW_PASSES: u64 = 4;

/// Up to this many bytes of a suite's cases are read back whole when windows would not do;
/// past it, case by case, so that memory stays bounded.
const REORDER_IN_MEMORY: u64 = 64 << 20;

impl JunitBuilder {
    pub(crate) fn new(info: &RunInfo, spill_dir: &Path) -> Self {
        let mut ranks = HashMap::with_capacity_and_hasher(info.scenarios.len(), Default::default());
        for (rank, s) in info.scenarios.iter().enumerate() {
            if let Ok(rank) = u32::try_from(rank) {
                ranks
                    .entry(scenario_key(&s.suite, &s.scenario))
                    .or_insert(rank);
            }
        }
        JunitBuilder {
            run_id: info.run_id.clone(),
            suites: info
                .suites
                .iter()
                .map(|name| SuitePart::new(name))
                .collect(),
            ranks,
            suffixes: HashMap::default(),
            wide: WideScenarios::default(),
            spill_dir: spill_dir.to_path_buf(),
        }
    }

    fn suite(&mut self, name: &str) -> &mut SuitePart {
        suite_in(&mut self.suites, name)
    }

    /// Widens the suite's wall-time span by the node's agent calls.
    pub(crate) fn add_node(&mut self, node: &NodeRecord) {
        let suite = self.suite(&node.suite);
        for turn in &node.turns {
            let (start, end) = (turn.started_ms, turn.end_ms());
            if !(start.is_finite() && end.is_finite()) {
                continue;
            }
            suite.span = Some(match suite.span {
                None => (start, end),
                Some((low, high)) => (low.min(start), high.max(end)),
            });
        }
    }

    /// Writes the trajectory's case; `info` is the run's plan, which gives its place.
    pub(crate) fn add(&mut self, t: &TrajectoryRecord, info: &RunInfo) -> Result<(), ReportError> {
        let (mut place, suffix) = Place::of(t, info, &self.ranks, &mut self.wide);
        if let Some(suffix) = suffix {
            let next = u32::try_from(self.suffixes.len() + 1).unwrap_or(u32::MAX);
            place.suffix = match self.suffixes.get(suffix) {
                Some(&id) => id,
                None => *self.suffixes.entry(suffix.into()).or_insert(next),
            };
        }
        let suite = suite_in(&mut self.suites, &t.suite);
        let seconds = seconds(t.duration_ms);
        suite.counts.tests += 1;
        suite.counts.seconds += seconds;
        // The case's name is `scenario/trajectory [agent #rep]`. Written piece by piece:
        // one `write!` of the whole line, with the name formatted first, was about a third
        // of the recorder's junit work per trajectory. The name's pieces escape the same
        // apart as together (its separators need none).
        let mut xml = String::with_capacity(256);
        xml.push_str("    <testcase name=\"");
        xml.push_str(&escape(&t.scenario));
        xml.push('/');
        xml.push_str(&escape(&t.trajectory));
        xml.push_str(" [");
        xml.push_str(&escape(&t.agent));
        xml.push_str(" #");
        crate::push_decimal(&mut xml, t.repetition as usize);
        xml.push_str("]\" classname=\"");
        xml.push_str(&escape(&t.suite));
        xml.push('.');
        // Jenkins splits a classname at its last dot into package and class: a dot in the
        // scenario's id would split the scenario instead of the suite from it.
        let scenario = escape(&t.scenario);
        if scenario.contains('.') {
            xml.push_str(&scenario.replace('.', "_"));
        } else {
            xml.push_str(&scenario);
        }
        // No `assertions`: Surefire's schema (junit-10) has no such attribute.
        let _ = write!(xml, "\" time=\"{seconds:.3}\"");
        match t.status {
            // Passed on the checks that ran: those that did not (no judge configured, say)
            // are said in its output, which CI shows with the case, rather than not at all.
            TrajectoryStatus::Passed if t.checks_with(CriterionStatus::Skipped) > 0 => {
                let mut out = String::from("passed the checks that ran; not checked:\n");
                for c in t
                    .criteria
                    .iter()
                    .filter(|c| c.status == CriterionStatus::Skipped)
                {
                    let _ = writeln!(
                        out,
                        "{} [{}]: {}",
                        c.criterion,
                        c.kind,
                        c.detail.as_deref().unwrap_or("not checked")
                    );
                }
                let _ = write!(
                    xml,
                    ">\n      <system-out>{}</system-out>\n    </testcase>\n",
                    escape(&out)
                );
            }
            TrajectoryStatus::Passed => xml.push_str("/>\n"),
            TrajectoryStatus::Failed => {
                suite.counts.failures += 1;
                let failed: Vec<_> = t
                    .criteria
                    .iter()
                    .filter(|c| c.status == CriterionStatus::Failed)
                    .collect();
                let not_run = t.checks_with(CriterionStatus::Skipped);
                let message = match failed.as_slice() {
                    // Failed with nothing failed: `--strict` counted what did not run.
                    [] if t.skip_reason.is_some() || not_run > 0 => match &t.skip_reason {
                        Some(reason) => format!("did not run (--strict): {reason}"),
                        None if not_run == 1 => "1 check did not run (--strict)".to_owned(),
                        None => format!("{not_run} checks did not run (--strict)"),
                    },
                    [] => "trajectory failed".to_owned(),
                    [one] => match &one.detail {
                        Some(detail) => format!("criterion failed: {}: {detail}", one.criterion),
                        None => format!("criterion failed: {}", one.criterion),
                    },
                    many => format!("{} criteria failed", many.len()),
                };
                let mut description = String::new();
                // The checks behind the failure: those that failed, or under `--strict`
                // those that did not run.
                let listed: Vec<_> = if failed.is_empty() {
                    t.criteria
                        .iter()
                        .filter(|c| c.status == CriterionStatus::Skipped)
                        .collect()
                } else {
                    failed.clone()
                };
                for c in &listed {
                    let turn = c
                        .turn_index
                        .map(|i| format!(" (turn {i})"))
                        .unwrap_or_default();
                    let _ = writeln!(
                        description,
                        "{} [{}]{}: {}",
                        c.criterion,
                        c.kind,
                        turn,
                        c.detail.as_deref().unwrap_or(c.status.as_str())
                    );
                }
                let _ = write!(
                    xml,
                    ">\n      <failure message=\"{}\" type=\"criteria\">{}</failure>\n    </testcase>\n",
                    escape(&message),
                    escape(&description)
                );
            }
            TrajectoryStatus::Error => {
                suite.counts.errors += 1;
                // Without a fault, a check whose evaluator failed (a judge) is the error.
                let errored = t
                    .criteria
                    .iter()
                    .find(|c| c.status == trellis_records::CriterionStatus::Error);
                let (message, kind) = match (&t.fault, errored) {
                    (Some(f), _) => (f.message.as_str(), f.category.as_str()),
                    (None, Some(c)) => (c.detail.as_deref().unwrap_or("check errored"), "check"),
                    (None, None) => ("trajectory errored", "error"),
                };
                let _ = write!(
                    xml,
                    ">\n      <error message=\"{}\" type=\"{}\"/>\n    </testcase>\n",
                    escape(message),
                    escape(kind)
                );
            }
            TrajectoryStatus::Skipped => {
                suite.counts.skipped += 1;
                let _ = write!(
                    xml,
                    ">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                    escape(t.skip_reason.as_deref().unwrap_or("skipped"))
                );
            }
            // The simulated user broke character: nothing to say about the agent, so
            // neither a failure nor a pass; CI shows the reason on the skipped case.
            TrajectoryStatus::Invalid => {
                suite.counts.skipped += 1;
                let reason = t
                    .invalid_reason()
                    .unwrap_or("the simulated user broke character");
                let _ = write!(
                    xml,
                    ">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                    escape(&format!("invalid: {reason}"))
                );
            }
        }
        let spill_dir = &self.spill_dir;
        suite
            .append(&xml, place, spill_dir)
            .map_err(|e| ReportError::io("write", spill_dir.join("junit.xml (spill file)"), e))
    }

    /// Writes `path.partial` and moves it into place once complete. `incomplete` says why
    /// the run did not cover its plan, when it did not: written as a test case in error of
    /// its own (suite `trellis`), so that a CI reading only JUnit does not show green what
    /// was never run.
    pub(crate) fn write(self, path: &Path, incomplete: Option<&str>) -> Result<(), ReportError> {
        let io_err = |e| ReportError::io("write", path, e);
        let (staged, file) = Staged::create(path)?;
        let mut out = BufWriter::new(file);
        let mut suites = self.suites;
        // Suffix ids in the order their first case finished, made ranks in text order.
        let mut by_text: Vec<(&str, u32)> =
            self.suffixes.iter().map(|(s, &id)| (&**s, id)).collect();
        by_text.sort_unstable();
        let mut rank_of = vec![0u32; by_text.len() + 1];
        for (rank, (_, id)) in by_text.iter().enumerate() {
            if let Some(slot) = rank_of.get_mut(*id as usize) {
                *slot = u32::try_from(rank + 1).unwrap_or(u32::MAX);
            }
        }
        for suite in &mut suites {
            for case in &mut suite.index {
                case.place.suffix = rank_of
                    .get(case.place.suffix as usize)
                    .copied()
                    .unwrap_or(0);
            }
        }
        if let Some(why) = incomplete {
            let mut run = SuitePart::new("trellis");
            run.counts.tests = 1;
            run.counts.errors = 1;
            run.append(
                &format!(
                    "    <testcase name=\"the run covers its plan\" classname=\"trellis\" \
                 time=\"0.000\">\n      <error message=\"{}\"/>\n    </testcase>\n",
                    escape(why)
                ),
                Place {
                    scenario: 0,
                    agent: 0,
                    repetition: 0,
                    trajectory: 0,
                    attempt: 0,
                    suffix: 0,
                },
                &self.spill_dir,
            )
            .map_err(io_err)?;
            suites.push(run);
        }
        for suite in &mut suites {
            if let Some((start, end)) = suite.span {
                suite.counts.seconds = seconds(end - start);
            }
        }
        let mut total = suites.iter().fold(Counts::default(), |mut sum, s| {
            sum.tests += s.counts.tests;
            sum.failures += s.counts.failures;
            sum.errors += s.counts.errors;
            sum.skipped += s.counts.skipped;
            sum
        });
        // Suites run at the same time too: the run's span, not the sum of theirs.
        let spans: Vec<(f64, f64)> = suites.iter().filter_map(|s| s.span).collect();
        total.seconds = match (
            spans.iter().map(|s| s.0).reduce(f64::min),
            spans.iter().map(|s| s.1).reduce(f64::max),
        ) {
            (Some(start), Some(end)) => seconds(end - start),
            _ => suites.iter().map(|s| s.counts.seconds).sum(),
        };
        writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>").map_err(io_err)?;
        // No `skipped` on `<testsuites>`: Jenkins' schema (junit-4) allows it only on a
        // `<testsuite>`.
        writeln!(
            out,
            "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" \
             time=\"{:.3}\">",
            escape(&format!("trellis {}", self.run_id)),
            total.tests,
            total.failures,
            total.errors,
            total.seconds
        )
        .map_err(io_err)?;
        for suite in suites {
            write!(
                out,
                "  <testsuite name=\"{}\" {}",
                escape(&suite.name),
                attributes(&suite.counts)
            )
            .map_err(io_err)?;
            match suite.cases {
                None => writeln!(out, "/>").map_err(io_err)?,
                Some(cases) => {
                    writeln!(out, ">").map_err(io_err)?;
                    let file = cases.into_inner().map_err(|e| io_err(e.into_error()))?;
                    let (index, written) = (suite.index, suite.written);
                    copy_in_plan_order(file, index, written, REORDER_IN_MEMORY, &mut out)
                        .map_err(io_err)?;
                    writeln!(out, "  </testsuite>").map_err(io_err)?;
                }
            }
        }
        writeln!(out, "</testsuites>").map_err(io_err)?;
        out.flush().map_err(io_err)?;
        drop(out);
        staged.publish().map(drop)
    }
}

/// The suite `trellis run --baseline` adds to `junit.xml`, last: one case, `no regression
/// against the baseline`, failing with the comparison's regressions.
pub(crate) const GATE_SUITE: &str = "trellis gate";

/// Regressions listed in the gate's failure at most; the rest are counted.
const GATE_LISTED: usize = 200;

/// The end of every `junit.xml` this module writes.
const CLOSING: &[u8] = b"</testsuites>\n";

/// Adds the gate's verdict to the `junit.xml` at `path` as a suite of its own, the last,
/// replacing one an earlier comparison added: a CI that reads only JUnit sees a regression
/// the run's own cases do not show (a latency rise, a scenario not run). `taken_out`, what
/// the baseline checked that this run does not (when that does not fail the gate), is said
/// in the case's output. The totals of `<testsuites>` are updated. The file is copied
/// through, not read whole.
pub(crate) fn add_gate(
    path: &Path,
    baseline: &str,
    regressions: &[String],
    taken_out: Option<&str>,
) -> Result<(), ReportError> {
    let io_err = |e| ReportError::io("write", path, e);
    let mut file = File::open(path).map_err(|e| ReportError::io("read", path, e))?;
    let size = file
        .metadata()
        .map_err(|e| ReportError::io("read", path, e))?
        .len();
    let mut head = io::BufReader::new(&mut file);
    let (mut declaration, mut suites_line) = (String::new(), String::new());
    head.read_line(&mut declaration).map_err(io_err)?;
    head.read_line(&mut suites_line).map_err(io_err)?;
    let header_len = (declaration.len() + suites_line.len()) as u64;
    let not_ours = || {
        ReportError::io(
            "read",
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                "not a junit.xml written by trellis",
            ),
        )
    };
    let count = |name: &str| -> Option<u64> {
        let at = suites_line.find(&format!(" {name}=\""))? + name.len() + 3;
        let rest = &suites_line[at..];
        rest[..rest.find('"')?].parse().ok()
    };
    let (Some(mut tests), Some(mut failures), Some(errors)) =
        (count("tests"), count("failures"), count("errors"))
    else {
        return Err(not_ours());
    };
    // Where the cases end: before an earlier gate's suite (the last), else before the
    // closing tag. An earlier gate is found in the file's tail, which holds it whole (its
    // failure lists at most `GATE_LISTED` lines).
    let tail_len = size.saturating_sub(header_len).min(4 << 20);
    file.seek(SeekFrom::Start(size - tail_len))
        .map_err(io_err)?;
    let mut tail = Vec::with_capacity(tail_len as usize);
    (&mut file)
        .take(tail_len)
        .read_to_end(&mut tail)
        .map_err(io_err)?;
    if !tail.ends_with(CLOSING) {
        return Err(not_ours());
    }
    let marker = format!("  <testsuite name=\"{GATE_SUITE}\" ");
    let mut cases_end = size - CLOSING.len() as u64;
    if let Some(at) = tail
        .windows(marker.len())
        .rposition(|w| w == marker.as_bytes())
    {
        let earlier = String::from_utf8_lossy(&tail[at..]);
        tests = tests.saturating_sub(1);
        if earlier.contains(" failures=\"1\"") {
            failures = failures.saturating_sub(1);
        }
        cases_end = size - tail_len + at as u64;
    }
    let regressed = !regressions.is_empty();
    tests += 1;
    failures += u64::from(regressed);
    let time = suites_line
        .find(" time=\"")
        .map(|at| &suites_line[at + 7..])
        .and_then(|rest| rest.find('"').map(|end| &rest[..end]))
        .unwrap_or("0.000")
        .to_owned();
    let name_end = suites_line.find(" tests=\"").ok_or_else(not_ours)?;

    let (staged, staged_file) = Staged::create(path)?;
    let mut out = BufWriter::new(staged_file);
    out.write_all(declaration.as_bytes()).map_err(io_err)?;
    writeln!(
        out,
        "{} tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time}\">",
        &suites_line[..name_end]
    )
    .map_err(io_err)?;
    file.seek(SeekFrom::Start(header_len)).map_err(io_err)?;
    io::copy(&mut (&mut file).take(cases_end - header_len), &mut out).map_err(io_err)?;
    // Named alike in every run, for CIs that track a case across builds; the baseline is
    // said in its output.
    write!(
        out,
        "{marker}tests=\"1\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"0.000\">\n    \
         <testcase name=\"no regression against the baseline\" classname=\"trellis\" \
         time=\"0.000\">\n",
        u64::from(regressed),
    )
    .map_err(io_err)?;
    if regressed {
        let mut body = String::new();
        for r in regressions.iter().take(GATE_LISTED) {
            let _ = writeln!(body, "- {r}");
        }
        if regressions.len() > GATE_LISTED {
            let _ = writeln!(
                body,
                "and {} more (compare.json has them all)",
                regressions.len() - GATE_LISTED
            );
        }
        let first = regressions.first().map(String::as_str).unwrap_or_default();
        let message = if regressions.len() == 1 {
            format!("regressed against {baseline}: {first}")
        } else {
            format!(
                "{} regressions against {baseline}, the first: {first}",
                regressions.len()
            )
        };
        writeln!(
            out,
            "      <failure type=\"regression\" message=\"{}\">{}</failure>",
            escape(&message),
            escape(&body)
        )
        .map_err(io_err)?;
    }
    writeln!(
        out,
        "      <system-out>{}</system-out>\n    </testcase>\n  </testsuite>",
        escape(&format!(
            "compared with the baseline {baseline}: {}{}",
            if regressed {
                "regressed (compare.json, compare.html)"
            } else {
                "no regression past the thresholds"
            },
            taken_out
                .map(|what| format!("; but {what}"))
                .unwrap_or_default()
        ))
    )
    .map_err(io_err)?;
    out.write_all(CLOSING).map_err(io_err)?;
    out.flush().map_err(io_err)?;
    drop(out);
    staged.publish().map(drop)
}

impl SuitePart {
    fn new(name: &str) -> Self {
        SuitePart {
            name: name.to_owned(),
            counts: Counts::default(),
            span: None,
            cases: None,
            index: Vec::new(),
            written: 0,
        }
    }

    fn append(&mut self, xml: &str, place: Place, spill_dir: &Path) -> io::Result<()> {
        let cases = match &mut self.cases {
            Some(cases) => cases,
            // Unnamed where the file system allows it (O_TMPFILE), else removed at once.
            None => self
                .cases
                .insert(BufWriter::new(tempfile::tempfile_in(spill_dir)?)),
        };
        cases.write_all(xml.as_bytes())?;
        let len =
            u32::try_from(xml.len()).map_err(|_| io::Error::other("a test case of over 4 GiB"))?;
        self.index.push(CaseAt {
            place,
            offset: self.written,
            len,
        });
        self.written += u64::from(len);
        Ok(())
    }
}

/// Copies a suite's spilled cases (`written` bytes, laid out as `index` says) to `out` in
/// the plan's order. Cases that finished in that order (one scenario run alone, a
/// sequential run) are copied as they lie.
///
/// Otherwise they are read back a window at a time: cases finish close to their place in
/// the plan (units start in its order), so the window read for one case holds the next
/// ones. Reading the file back whole took as much fresh memory as the file at the end of the
/// run, 34 MB for 300,000 one-turn trajectories (docs/performance.md, "The end of big runs:
/// what it reads back, sorts and frees"); a window is 1 MB, reused. When windows would read
/// the file over and over (many scenarios interleaved), it is read whole if it is at most
/// `in_memory` bytes, else case by case.
fn copy_in_plan_order(
    mut file: File,
    mut index: Vec<CaseAt>,
    written: u64,
    in_memory: u64,
    out: &mut impl Write,
) -> io::Result<()> {
    file.rewind()?;
    if index.is_sorted_by_key(|c| c.place) {
        io::copy(&mut file, out)?;
        return Ok(());
    }
    // Stable: cases at the same place (a journal without the plan) keep their order.
    index.sort_by_key(|c| c.place);
    let size =
        if windows_read(&index, written, REORDER_WINDOW) <= written.saturating_mul(WINDOW_PASSES) {
            REORDER_WINDOW
        } else if written <= in_memory {
            written
        } else {
            0
        };
    copy_through_windows(&mut file, &index, written, size, out)
}

/// Copies the cases of `index`, in its order, reading `file` through windows of `size` bytes
/// ([`window_for`]).
fn copy_through_windows(
    file: &mut File,
    index: &[CaseAt],
    written: u64,
    size: u64,
    out: &mut impl Write,
) -> io::Result<()> {
    let mut window = Vec::new();
    let mut at = 0..0;
    for case in index {
        let end = case_end(case)?;
        if let Some(next) = window_for(case.offset, end, &at, written, size) {
            window.clear();
            file.seek(SeekFrom::Start(next.start))?;
            let len = next.end - next.start;
            // Exactly the window's room: grown by doubling as it is read, it took up to twice
            // the file's size.
            window.reserve_exact(usize::try_from(len).unwrap_or(0));
            (&mut *file).take(len).read_to_end(&mut window)?;
            if window.len() as u64 != len {
                return Err(io::Error::other("a test case beyond its file"));
            }
            at = next;
        }
        // Within the window: `window_for` made it hold the case.
        let from = usize::try_from(case.offset - at.start).unwrap_or(usize::MAX);
        let case_bytes = from
            .checked_add(case.len as usize)
            .and_then(|to| window.get(from..to))
            .ok_or_else(|| io::Error::other("a test case beyond its file"))?;
        out.write_all(case_bytes)?;
    }
    Ok(())
}

fn case_end(case: &CaseAt) -> io::Result<u64> {
    case.offset
        .checked_add(u64::from(case.len))
        .ok_or_else(|| io::Error::other("a test case beyond its file"))
}

/// The window to read for the case at `start..end`, or `None` when the window `at` holds it.
/// A window of `size` bytes starts a quarter of itself before the case (cases placed just
/// after it in the plan may have finished just before it); one of the file's size or more
/// is the whole file, one of 0 the case alone.
fn window_for(
    start: u64,
    end: u64,
    at: &std::ops::Range<u64>,
    written: u64,
    size: u64,
) -> Option<std::ops::Range<u64>> {
    if at.start <= start && end <= at.end {
        return None;
    }
    if size >= written {
        return Some(0..written.max(end));
    }
    let from = start - (size / 4).min(start);
    Some(from..from.saturating_add(size).min(written).max(end))
}

/// How many bytes copying `index` (in the plan's order) with windows of `size` would read.
fn windows_read(index: &[CaseAt], written: u64, size: u64) -> u64 {
    let mut at = 0..0;
    let mut read = 0u64;
    for case in index {
        let Ok(end) = case_end(case) else {
            return u64::MAX;
        };
        if let Some(next) = window_for(case.offset, end, &at, written, size) {
            read = read.saturating_add(next.end - next.start);
            at = next;
        }
    }
    read
}

fn attributes(c: &Counts) -> String {
    format!(
        "tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\"",
        c.tests, c.failures, c.errors, c.skipped, c.seconds
    )
}

fn seconds(ms: f64) -> f64 {
    // The journal is data: a negative or non-finite duration must not poison the totals.
    if ms.is_finite() && ms > 0.0 {
        ms / 1000.0
    } else {
        0.0
    }
}

/// Escapes text for an XML attribute or element. Characters XML 1.0 cannot carry at all
/// (most control characters, which agents do send) become U+FFFD; the bidirectional
/// controls, which would reverse the rest of a line in a CI's test viewer, are written
/// as `\u{..}`, as the report and the console show them.
fn escape(text: &str) -> Cow<'_, str> {
    // Names and messages rarely hold anything to escape: those are returned as they are,
    // found by one pass over their bytes (every character escaped or replaced starts with
    // an ASCII byte below 0x3f, is U+FFFE/U+FFFF, which start with 0xEF, or is a
    // bidirectional control, which starts with 0xE2 or 0xD8).
    let clean = text
        .bytes()
        .all(|b| !matches!(b, b'&' | b'<' | b'>' | b'"' | b'\'' | 0xEF | 0xE2 | 0xD8) && b >= 0x20);
    if clean {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c if trellis_records::shown::bidi_control(c) => {
                trellis_records::shown::push_escaped(&mut out, c);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trajectory named `name` of scenario `c`, forked by the agent along `forks`.
    fn record(name: &str, forks: &[&str]) -> TrajectoryRecord {
        let branches: Vec<serde_json::Value> = forks
            .iter()
            .map(|label| {
                serde_json::json!({"label": label, "option": label, "reason": null,
                    "index": 1, "count": 2, "depth": 1})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "suite": "s", "scenario": "c", "trajectory": name, "agent": "a",
            "protocol": "multiagent", "repetition": 0, "nodes": ["start"],
            "status": "passed", "turns": 1, "duration_ms": 1.0, "criteria": [], "tags": [],
            "agent_branches": branches,
        }))
        .unwrap()
    }

    /// Retries after their first attempt, in the order of their numbers; forks after the
    /// trajectory or attempt they fork from; a branch name holding `@` or `~` of its own is
    /// its own trajectory.
    #[test]
    fn forks_and_retries_go_after_what_they_come_from() {
        let info = RunInfo {
            scenarios: vec![trellis_records::ScenarioInfo {
                suite: "s".into(),
                scenario: "c".into(),
                agents: vec!["a".into()],
                trajectories: vec!["z@1".into(), "m".into(), "z".into()],
                repeat: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut junit = JunitBuilder::new(&info, &std::env::temp_dir());
        let finished = [
            ("z@retry10", &[][..]),
            ("z@1~refund", &["refund"][..]),
            ("m", &[][..]),
            ("z@retry2~refund", &["refund"][..]),
            ("z", &[][..]),
            ("z@retry2", &[][..]),
            ("z@1", &[][..]),
            ("z~refund", &["refund"][..]),
        ];
        for (name, forks) in finished {
            junit.add(&record(name, forks), &info).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junit.xml");
        junit.write(&path, None).unwrap();
        let xml = std::fs::read_to_string(&path).unwrap();
        let names: Vec<&str> = xml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("<testcase name=\"c/"))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert_eq!(
            names,
            [
                "z@1",
                "z@1~refund",
                "m",
                "z",
                "z~refund",
                "z@retry2",
                "z@retry2~refund",
                "z@retry10"
            ]
        );
    }

    /// The place of a case of `scenario`'s first agent and trajectory.
    fn place(scenario: u32, repetition: u32) -> Place {
        Place {
            scenario,
            agent: 0,
            repetition,
            trajectory: 0,
            attempt: 0,
            suffix: 0,
        }
    }

    /// Cases spilled out of order come back in the plan's, read whole or one by one.
    #[test]
    fn spilled_cases_are_copied_in_the_plans_order_either_way() {
        let mut suite = SuitePart::new("s");
        for (text, at) in [
            ("c", place(1, 0)),
            ("a", place(0, 0)),
            ("d-unplanned", place(u32::MAX, 0)),
            ("b", place(0, 1)),
            ("c2", place(1, 0)),
        ] {
            suite
                .append(&format!("<{text}>\n"), at, &std::env::temp_dir())
                .unwrap();
        }
        let file = suite.cases.take().unwrap().into_inner().unwrap();
        let in_order = "<a>\n<b>\n<c>\n<c2>\n<d-unplanned>\n";
        let mut out = Vec::new();
        let copy = file.try_clone().unwrap();
        copy_in_plan_order(copy, suite.index.clone(), suite.written, 0, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), in_order);
        // Every window size: the case alone, windows smaller and larger than a case, the
        // whole file and more.
        let mut index = suite.index.clone();
        index.sort_by_key(|c| c.place);
        for size in [0, 1, 3, 4, 7, 12, suite.written, u64::MAX] {
            let mut out = Vec::new();
            let mut copy = file.try_clone().unwrap();
            copy_through_windows(&mut copy, &index, suite.written, size, &mut out).unwrap();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                in_order,
                "windows of {size}"
            );
        }
    }

    /// Cases that finished near their place in the plan are read through windows about
    /// once; scenarios run side by side, whose cases alternate in the file, about once per
    /// scenario (the plan's order takes one scenario's cases at a time), so that many of them
    /// are read back whole instead.
    #[test]
    fn windows_read_near_ordered_cases_once_and_interleaved_ones_often() {
        let case = |scenario, repetition, offset| CaseAt {
            place: place(scenario, repetition),
            offset,
            len: 100,
        };
        let n = 10_000u32;
        // Finished in pairs swapped: 1, 0, 3, 2, ...
        let mut near: Vec<CaseAt> = (0..n).map(|i| case(0, i ^ 1, u64::from(i) * 100)).collect();
        near.sort_by_key(|c| c.place);
        let written = u64::from(n) * 100;
        let read = windows_read(&near, written, 64 * 1024);
        assert!(read <= written * 2, "{read} bytes for {written}");
        // Scenarios alternating: the file is read about once per scenario.
        let interleaved = |scenarios: u32| {
            let mut index: Vec<CaseAt> = (0..n)
                .map(|i| case(i % scenarios, i / scenarios, u64::from(i) * 100))
                .collect();
            index.sort_by_key(|c| c.place);
            windows_read(&index, written, 4 * 1024)
        };
        let two = interleaved(2);
        assert!(two <= written * WINDOW_PASSES, "{two} bytes for {written}");
        let eight = interleaved(8);
        assert!(
            eight > written * WINDOW_PASSES,
            "{eight} bytes for {written}"
        );
    }

    #[test]
    fn escapes_markup_and_replaces_characters_xml_cannot_hold() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("x\u{1}y\nz"), "x\u{FFFD}y&#10;z");
        assert_eq!(escape("a\u{FFFE}b\u{FFFF}"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(escape("tab\there"), "tab&#9;here");
        assert_eq!(escape("a\u{202e}evil “b”"), "a\\u{202e}evil “b”");
        // Nothing to escape: the text itself, not a copy.
        assert!(matches!(
            escape("booking / main #3 é"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(
            escape("\u{FFFD} stays"),
            std::borrow::Cow::Owned(_)
        ));
        assert_eq!(escape("\u{FFFD} stays"), "\u{FFFD} stays");
    }
}
