//! The compare page: two runs side by side, one self-contained file like `report.html`.
//!
//! [`ComparePage`] is plain data (whatever computes the comparison fills it: verdicts,
//! p-values and thresholds are its business); [`write_compare`] lays it out. Rows keep the
//! order they are given in; the page lists the regressions first, linked to their rows, and
//! can hide what did not change.

use std::io::{BufWriter, Write};
use std::path::Path;

use minijinja::Value;
use serde::Serialize;

use super::{COMPARE_TEMPLATES, SCRIPT_COMPARE, STYLE, environment, view};
use crate::error::ReportError;
use crate::staged::Staged;

/// Successes out of samples on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompareTally {
    pub passed: u64,
    pub samples: u64,
}

/// A pass rate in both runs and what the comparison made of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareRate {
    pub base: Option<CompareTally>,
    pub head: Option<CompareTally>,
    /// Head minus base, in percentage points.
    pub delta_points: Option<f64>,
    pub p_value: Option<f64>,
    /// `regressed`, `noise`, `unchanged`, `improved`, `added`, `removed`, `not comparable`.
    pub verdict: String,
}

/// One side of the comparison.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareRun {
    pub run_id: String,
    pub name: Option<String>,
    pub started_at: String,
    pub finished: bool,
}

/// A run-level metric in both runs. Metrics named `*_ms` are shown as durations and
/// `pass_rate` (a fraction, 0–1) as a percentage; others as numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareMetric {
    pub metric: String,
    /// The agent it is of, `None` for the whole run.
    pub agent: Option<String>,
    /// What decided the verdict, where the figures alone do not say.
    pub why: Option<String>,
    pub base: Option<f64>,
    pub head: Option<f64>,
    pub delta: Option<f64>,
    pub threshold: Option<f64>,
    pub p_value: Option<f64>,
    pub verdict: String,
}

/// A pass rate of one scenario, branch or criterion in both runs. `trajectory` is empty for
/// a scenario row; `criterion` is empty unless the row is a criterion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareRow {
    pub suite: String,
    pub scenario: String,
    pub trajectory: String,
    pub agent: String,
    /// The turn a criterion checked (zero-based, as in `criteria.parquet`).
    pub turn_index: Option<u32>,
    pub criterion: String,
    pub rate: CompareRate,
    /// Why it failed in the head run, when it did.
    pub head_failure: Option<String>,
}

/// Everything the compare page shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComparePage {
    pub base: CompareRun,
    pub head: CompareRun,
    pub metrics: Vec<CompareMetric>,
    pub scenarios: Vec<CompareRow>,
    pub branches: Vec<CompareRow>,
    pub criteria: Vec<CompareRow>,
    /// One sentence per regression.
    pub regressions: Vec<String>,
    pub regressed: bool,
    /// What qualifies the verdict (runs made under different rules, a judge score that
    /// does not gate), one sentence each.
    pub notes: Vec<String>,
}

/// Writes the compare page as `path.partial` and moves it into place once complete.
pub fn write_compare(path: &Path, page: &ComparePage) -> Result<(), ReportError> {
    let view = CompareView::of(page);
    let (staged, file) = Staged::create(path)?;
    let mut out = BufWriter::new(file);
    render(&view, &mut out).map_err(|e| ReportError::Template {
        path: path.to_path_buf(),
        source: e,
    })?;
    out.flush().map_err(|e| ReportError::io("write", path, e))?;
    drop(out);
    staged.publish().map(drop)
}

fn render(view: &CompareView, out: impl Write) -> Result<(), minijinja::Error> {
    let env = environment(COMPARE_TEMPLATES)?;
    let template = env.get_template("compare.html")?;
    let context = minijinja::context! {
        page => Value::from(minijinja::value::Serde(view)),
        style => Value::from_safe_string(STYLE.to_owned()),
        script => Value::from_safe_string(SCRIPT_COMPARE.to_owned()),
        script_hash => view::script_hash(SCRIPT_COMPARE),
    };
    template.render_captured_to(context, out).map(drop)
}

#[derive(Serialize)]
struct RunView {
    label: String,
    run_id: String,
    started_at: String,
    finished: bool,
}

#[derive(Serialize)]
struct CellView {
    base: String,
    head: String,
    delta: String,
    /// `up`, `down` or `flat`, for colour.
    direction: &'static str,
    p_value: String,
    verdict: String,
    /// The verdict as a CSS class.
    verdict_class: String,
    changed: bool,
}

#[derive(Serialize)]
struct RowView {
    anchor: String,
    what: String,
    context: String,
    cell: CellView,
    head_failure: Option<String>,
}

#[derive(Serialize)]
struct RegressionView {
    text: String,
}

/// Rows of a section the page lists at most, of what changed and of what did not; the rest
/// are counted (`compare.json` has every row). Unchanged rows were only hidden by the
/// page's filter: two identical runs of 50,000 dataset rows made a 48 MB page that took a
/// browser 70 s to open.
const MAX_CHANGED_ROWS: usize = 5_000;
const MAX_UNCHANGED_ROWS: usize = 500;

#[derive(Serialize)]
struct SectionView {
    title: &'static str,
    /// What a row's pass rate counts.
    about: &'static str,
    rows: Vec<RowView>,
    changed: usize,
    total: usize,
    /// Rows past [`MAX_CHANGED_ROWS`] and [`MAX_UNCHANGED_ROWS`], not listed.
    unlisted_changed: usize,
    unlisted_unchanged: usize,
}

#[derive(Serialize)]
struct CompareView {
    base: RunView,
    head: RunView,
    regressed: bool,
    regressions: Vec<RegressionView>,
    notes: Vec<String>,
    metrics: Vec<RowView>,
    sections: Vec<SectionView>,
}

fn run_view(run: &CompareRun) -> RunView {
    RunView {
        label: run.name.clone().unwrap_or_else(|| run.run_id.clone()),
        run_id: run.run_id.clone(),
        started_at: run.started_at.clone(),
        finished: run.finished,
    }
}

fn verdict_class(verdict: &str) -> String {
    verdict.replace(' ', "-")
}

fn is_change(verdict: &str) -> bool {
    !matches!(verdict, "unchanged" | "not comparable" | "not gated")
}

fn tally(t: Option<CompareTally>) -> String {
    match t {
        Some(t) if t.samples > 0 => format!(
            "{}/{} · {:.1}%",
            t.passed,
            t.samples,
            t.passed as f64 * 100.0 / t.samples as f64
        ),
        Some(t) => format!("{}/{}", t.passed, t.samples),
        None => "–".to_owned(),
    }
}

fn p_value(p: Option<f64>) -> String {
    p.map(crate::compare::p_said).unwrap_or_default()
}

/// How a change is coloured: by its sign, unless the comparison found none (a latency of
/// "+0 ms" or "+7 ms" within the noise is not drawn as a loss beside "unchanged").
fn direction(delta: Option<f64>, higher_is_better: bool, verdict: &str) -> &'static str {
    if matches!(verdict, "unchanged" | "not gated" | "not comparable") {
        return "flat";
    }
    match delta {
        Some(d) if d.abs() < 1e-9 => "flat",
        Some(d) if (d > 0.0) == higher_is_better => "up",
        Some(_) => "down",
        None => "flat",
    }
}

fn rate_cell(rate: &CompareRate) -> CellView {
    CellView {
        base: tally(rate.base),
        head: tally(rate.head),
        delta: rate
            .delta_points
            .map_or_else(String::new, |d| format!("{d:+.1} pts").replace('-', "−")),
        direction: direction(rate.delta_points, true, &rate.verdict),
        p_value: p_value(rate.p_value),
        verdict: rate.verdict.clone(),
        verdict_class: verdict_class(&rate.verdict),
        changed: is_change(&rate.verdict),
    }
}

fn metric_value(metric: &str, value: Option<f64>) -> String {
    metric_value_in(metric, value, value.is_some_and(|v| v.abs() >= 1000.0))
}

/// `value` of `metric`; a duration (`*_ms`) in seconds when `seconds`, so that a row's
/// base, head and change share a unit (`950 ms` beside `1.05 s` and a change of `+100 ms`
/// read as three scales), and with a decimal under 10 ms (a change of 0.3 ms is not `+0`).
fn metric_value_in(metric: &str, value: Option<f64>, seconds: bool) -> String {
    match value {
        None => "–".to_owned(),
        Some(v) if !v.is_finite() => "–".to_owned(),
        Some(v) if metric.ends_with("_ms") => {
            if seconds {
                format!("{:.2} s", v / 1000.0)
            } else if v.abs() < 10.0 && v != 0.0 {
                format!("{v:.1} ms")
            } else {
                format!("{v:.0} ms")
            }
        }
        Some(v) if metric == "pass_rate" => format!("{:.1}%", v * 100.0),
        Some(v) if v.fract() == 0.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

fn metric_row(index: usize, m: &CompareMetric) -> RowView {
    // Latency and tokens are better lower; rates and scores higher.
    let higher_is_better = !(m.metric.ends_with("_ms") || m.metric.contains("token"));
    let seconds = [m.base, m.head]
        .into_iter()
        .flatten()
        .any(|v| v.is_finite() && v.abs() >= 1000.0);
    let delta = m.delta.map_or_else(String::new, |d| {
        let magnitude = metric_value_in(&m.metric, Some(d.abs()), seconds);
        let sign = if d < 0.0 { "−" } else { "+" };
        if m.metric == "pass_rate" {
            format!("{sign}{:.1} pts", d.abs() * 100.0)
        } else {
            format!("{sign}{magnitude}")
        }
    });
    RowView {
        anchor: format!("m{index}"),
        what: match &m.agent {
            Some(agent) => format!(
                "{} of agent {agent}",
                m.metric.trim_end_matches("_ms").replace('_', " ")
            ),
            None => m.metric.trim_end_matches("_ms").replace('_', " "),
        },
        // Thresholds are in the gate's own terms: a percentage of the base's mean for
        // latency, points for the pass rate.
        context: m
            .threshold
            .map(|t| match m.metric.as_str() {
                "latency_mean_ms" => format!("threshold +{t}%"),
                // A drop of at most nothing reads "0 pts", not "−0.0 pts".
                "pass_rate" if t == 0.0 => "threshold 0 pts".to_owned(),
                "pass_rate" => format!("threshold −{:.1} pts", t * 100.0),
                "mean_score" if t == 0.0 => "threshold 0 pts".to_owned(),
                "mean_score" => format!("threshold −{t} pts"),
                _ => format!("threshold {}", metric_value(&m.metric, Some(t))),
            })
            .unwrap_or_default(),
        cell: CellView {
            base: metric_value_in(&m.metric, m.base, seconds),
            head: metric_value_in(&m.metric, m.head, seconds),
            delta,
            direction: direction(m.delta, higher_is_better, &m.verdict),
            p_value: p_value(m.p_value),
            verdict: m.verdict.clone(),
            verdict_class: verdict_class(&m.verdict),
            changed: is_change(&m.verdict),
        },
        head_failure: m.why.clone(),
    }
}

fn row(prefix: &str, index: usize, r: &CompareRow) -> RowView {
    let what = if !r.criterion.is_empty() {
        r.criterion.clone()
    } else if !r.trajectory.is_empty() {
        r.trajectory.clone()
    } else {
        r.scenario.clone()
    };
    let mut context = vec![r.suite.clone()];
    if !r.criterion.is_empty() || !r.trajectory.is_empty() {
        context.push(r.scenario.clone());
    }
    if !r.criterion.is_empty() && !r.trajectory.is_empty() {
        context.push(r.trajectory.clone());
    }
    let mut context = context.join(" / ");
    if !r.agent.is_empty() {
        context.push_str(&format!(" · {}", r.agent));
    }
    if let Some(turn) = r.turn_index {
        context.push_str(&format!(" · turn {turn}"));
    }
    RowView {
        anchor: format!("{prefix}{index}"),
        what,
        context,
        cell: rate_cell(&r.rate),
        head_failure: r.head_failure.clone(),
    }
}

impl CompareView {
    fn of(page: &ComparePage) -> Self {
        let section = |title, about, prefix: &str, rows: &[CompareRow]| {
            let mut view = SectionView {
                title,
                about,
                rows: Vec::new(),
                changed: 0,
                total: rows.len(),
                unlisted_changed: 0,
                unlisted_unchanged: 0,
            };
            let mut unchanged = 0;
            for (i, r) in rows.iter().enumerate() {
                if is_change(&r.rate.verdict) {
                    view.changed += 1;
                    if view.changed > MAX_CHANGED_ROWS {
                        view.unlisted_changed += 1;
                        continue;
                    }
                } else {
                    unchanged += 1;
                    if unchanged > MAX_UNCHANGED_ROWS {
                        view.unlisted_unchanged += 1;
                        continue;
                    }
                }
                // Anchors by the row's place in the comparison, listed or not.
                view.rows.push(row(prefix, i, r));
            }
            view
        };
        CompareView {
            base: run_view(&page.base),
            head: run_view(&page.head),
            regressed: page.regressed,
            regressions: page
                .regressions
                .iter()
                .map(|text| RegressionView { text: text.clone() })
                .collect(),
            notes: page.notes.clone(),
            metrics: page
                .metrics
                .iter()
                .enumerate()
                .map(|(i, m)| metric_row(i, m))
                .collect(),
            sections: vec![
                section(
                    "Scenarios",
                    "A scenario's rate counts its repetitions in which every branch passed; \
                     a branch's own rate is under Branches.",
                    "s",
                    &page.scenarios,
                ),
                section(
                    "Branches",
                    "Each trajectory (one path through the scenario's branches), across its \
                     repetitions.",
                    "b",
                    &page.branches,
                ),
                section(
                    "Criteria",
                    "Each check, across the trajectories and repetitions that reached it.",
                    "c",
                    &page.criteria,
                ),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate that allows no drop says so without a signed zero.
    #[test]
    fn thresholds_read_in_the_gates_terms_and_zero_has_no_sign() {
        let context = |metric: &str, threshold: f64| {
            let m = CompareMetric {
                metric: metric.to_owned(),
                threshold: Some(threshold),
                ..Default::default()
            };
            metric_row(0, &m).context
        };
        assert_eq!(context("pass_rate", 0.0), "threshold 0 pts");
        assert_eq!(context("pass_rate", 0.05), "threshold −5.0 pts");
        assert_eq!(context("mean_score", 0.0), "threshold 0 pts");
        assert_eq!(context("mean_score", 0.5), "threshold −0.5 pts");
        assert_eq!(context("latency_mean_ms", 20.0), "threshold +20%");
    }

    /// A latency row's base, head and change share one unit, and a change under a
    /// millisecond is not `+0 ms`.
    #[test]
    fn a_latency_row_reads_in_one_unit() {
        let cells = |base: f64, head: f64| {
            let m = CompareMetric {
                metric: "latency_mean_ms".to_owned(),
                base: Some(base),
                head: Some(head),
                delta: Some(head - base),
                verdict: "regressed".to_owned(),
                ..Default::default()
            };
            let c = metric_row(0, &m).cell;
            (c.base, c.head, c.delta)
        };
        assert_eq!(
            cells(950.0, 1050.0),
            (
                "0.95 s".to_owned(),
                "1.05 s".to_owned(),
                "+0.10 s".to_owned()
            )
        );
        assert_eq!(
            cells(12.0, 12.3),
            ("12 ms".to_owned(), "12 ms".to_owned(), "+0.3 ms".to_owned())
        );
        assert_eq!(
            cells(40.0, 31.0),
            ("40 ms".to_owned(), "31 ms".to_owned(), "−9.0 ms".to_owned())
        );
    }
}
