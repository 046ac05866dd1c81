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
//! has, which an in-memory report (such as `quick-junit`'s) cannot offer.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Seek, Write};
use std::path::Path;

use trellis_records::{CriterionStatus, NodeRecord, RunInfo, TrajectoryRecord, TrajectoryStatus};

use crate::error::ReportError;
use crate::staged::Staged;

pub(crate) struct JunitBuilder {
    run_id: String,
    /// Suites in the run's load order; suites the run did not announce are appended.
    suites: Vec<SuitePart>,
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
    /// The `<testcase>` elements written so far; created on the first case.
    cases: Option<BufWriter<File>>,
}

impl JunitBuilder {
    pub(crate) fn new(info: &RunInfo) -> Self {
        JunitBuilder {
            run_id: info.run_id.clone(),
            suites: info
                .suites
                .iter()
                .map(|name| SuitePart::new(name))
                .collect(),
        }
    }

    fn suite(&mut self, name: &str) -> &mut SuitePart {
        let index = match self.suites.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.suites.push(SuitePart::new(name));
                self.suites.len() - 1
            }
        };
        &mut self.suites[index]
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

    pub(crate) fn add(&mut self, t: &TrajectoryRecord) -> Result<(), ReportError> {
        let suite = self.suite(&t.suite);
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
        let _ = write!(xml, " #{}]\" classname=\"", t.repetition);
        xml.push_str(&escape(&t.suite));
        xml.push('.');
        xml.push_str(&escape(&t.scenario));
        let _ = write!(
            xml,
            "\" time=\"{seconds:.3}\" assertions=\"{}\"",
            t.criteria.len()
        );
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
        suite
            .append(&xml)
            .map_err(|e| ReportError::io("write", Path::new("junit.xml (spill file)"), e))
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
        if let Some(why) = incomplete {
            let mut run = SuitePart::new("trellis");
            run.counts.tests = 1;
            run.counts.errors = 1;
            run.append(&format!(
                "    <testcase name=\"the run covers its plan\" classname=\"trellis\" \
                 time=\"0.000\">\n      <error message=\"{}\"/>\n    </testcase>\n",
                escape(why)
            ))
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
        writeln!(
            out,
            "<testsuites name=\"{}\" {}>",
            escape(&format!("trellis {}", self.run_id)),
            attributes(&total)
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
                    let mut file = cases.into_inner().map_err(|e| io_err(e.into_error()))?;
                    file.rewind().map_err(io_err)?;
                    io::copy(&mut file, &mut out).map_err(io_err)?;
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

impl SuitePart {
    fn new(name: &str) -> Self {
        SuitePart {
            name: name.to_owned(),
            counts: Counts::default(),
            span: None,
            cases: None,
        }
    }

    fn append(&mut self, xml: &str) -> io::Result<()> {
        let cases = match &mut self.cases {
            Some(cases) => cases,
            None => self.cases.insert(BufWriter::new(tempfile::tempfile()?)),
        };
        cases.write_all(xml.as_bytes())
    }
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
    use super::escape;

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
