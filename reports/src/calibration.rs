//! `trellis calibrate`: human labels joined with a run's LLM-judged checks, agreement per
//! judge and rubric ([`crate::calibrate`]), and the judges below the agreement floor.
//!
//! The judged checks come from the run's `criteria.parquet`: rows whose `judge` column is
//! set. A label matches a check on scenario, trajectory and criterion text, and on suite,
//! agent, repetition and turn when the label gives them; a label that matches no check, or
//! more than one, or a check that already has a label, is listed, as are judged checks
//! without a label. The result is [`Calibration`], written as `calibration.json` into the
//! run directory; [`untrusted_judges`] reads it back for `trellis compare`, which does not
//! gate on the mean judge score of a run whose judge is below the floor. The layout is
//! documented in `docs/results.md`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use polars_error::{PolarsError, PolarsResult};
use serde::{Deserialize, Serialize};

use crate::calibrate::{self, Figure};
use crate::labels::HumanLabel;

/// The calibration written into the run directory.
pub const CALIBRATION_FILE: &str = "calibration.json";
/// Version of `calibration.json`'s layout.
pub const CALIBRATION_SCHEMA_VERSION: u32 = 1;

/// The agreement a judge must reach.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Floors {
    /// Cohen's kappa below this marks the judge (default 0.6, "substantial").
    pub min_kappa: f64,
    /// Pearson's r below this marks the judge; `None` does not check it.
    pub min_correlation: Option<f64>,
}

impl Default for Floors {
    fn default() -> Self {
        Floors {
            min_kappa: 0.6,
            min_correlation: None,
        }
    }
}

/// Whether a judge can be trusted on a rubric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Every floor that could be checked is met.
    Trusted,
    /// A figure is below its floor: gating on this judge's scores is refused.
    BelowFloor,
    /// No floor could be checked (too few labels, one category only, …).
    NotEstablished,
}

/// Agreement of one judge on one rubric with the human labels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeAgreement {
    pub judge: String,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub rubric: String,
    /// Labelled checks the judge answered.
    pub n: usize,
    /// Of those, the ones where both sides have a score (for the correlations and MAE).
    pub scored: usize,
    /// Share of labelled checks where the categories agree.
    pub agreement: Figure,
    pub kappa: Figure,
    pub pearson: Figure,
    pub spearman: Figure,
    pub mae: Figure,
    pub trust: Trust,
    /// Why the judge is below the floor, or why trust is not established.
    pub reasons: Vec<String>,
}

/// A judged check of the run, as a label refers to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckRef {
    pub suite: String,
    pub scenario: String,
    pub trajectory: String,
    pub agent: String,
    pub repetition: u32,
    pub turn_index: Option<u32>,
    pub criterion: String,
    pub judge: String,
    /// The check's status in the run (`error` when its judge failed, `skipped` when it was
    /// never judged).
    #[serde(default)]
    pub status: String,
    /// For judged checks their judge did not answer: the `detail` (why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A label that was not used, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnusedLabel {
    /// Line in the labels file.
    pub line: usize,
    pub scenario: String,
    pub trajectory: String,
    pub criterion: String,
    pub why: String,
}

/// `calibration.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub schema_version: u32,
    pub run_id: String,
    pub labels_file: String,
    pub floors: Floors,
    /// Judged checks in the run (rows of `criteria.parquet` with a `judge`).
    pub judged_checks: usize,
    /// Rows in the labels file.
    pub labels: usize,
    /// Labels matched to exactly one judged check.
    pub matched: usize,
    /// Per judge and rubric, by judge then rubric.
    pub judges: Vec<JudgeAgreement>,
    /// Judges with a rubric below the floor.
    pub below_floor: Vec<String>,
    /// Labels that match no judged check, several, or a check labelled already.
    pub unmatched_labels: Vec<UnusedLabel>,
    /// Judged checks no label matched.
    pub unlabeled_checks: Vec<CheckRef>,
    /// Labelled checks their judge did not answer: it failed (`status = 'error'`) or was
    /// never asked (`skipped` without a score). Left out.
    pub judge_errors: Vec<CheckRef>,
}

/// Why a run could not be calibrated.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CalibrationError {
    #[error("cannot read {}", path.display())]
    #[diagnostic(
        code(trellis::calibrate::criteria),
        help(
            "point at a run directory; `trellis report DIR` rebuilds its tables from the journal"
        )
    )]
    Criteria {
        path: PathBuf,
        #[source]
        source: PolarsError,
    },

    #[error("this run has no judged checks ({} has no row with a judge)", path.display())]
    #[diagnostic(
        code(trellis::calibrate::no_judged_checks),
        help(
            "calibrate a run of suites with `judge` or `outcome` criteria scored by an LLM judge"
        )
    )]
    NoJudgedChecks { path: PathBuf },

    #[error(
        "the labels in {labels_file} for judge `{judge}` (rubric `{rubric}`) share no category with the judge's: the labels say {human}, the judge says {judged}"
    )]
    #[diagnostic(
        code(trellis::calibrate::vocabulary),
        help(
            "label with the judge's own categories, or with `pass`/`fail`, which are compared with the judge's verdict"
        )
    )]
    Vocabulary {
        labels_file: String,
        judge: String,
        rubric: String,
        human: String,
        judged: String,
    },

    #[error("cannot read {}", path.display())]
    #[diagnostic(code(trellis::calibrate::calibration_json))]
    BadCalibration {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One row of `criteria.parquet`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckRow {
    pub run_id: String,
    pub suite: String,
    pub scenario: String,
    pub trajectory: String,
    pub agent: String,
    pub repetition: u32,
    pub turn_index: Option<u32>,
    pub criterion: String,
    pub kind: String,
    pub status: String,
    pub detail: Option<String>,
    pub judge: Option<String>,
    pub judge_provider: Option<String>,
    pub judge_model: Option<String>,
    pub rubric: Option<String>,
    pub score: Option<f64>,
    pub threshold: Option<f64>,
    pub label: Option<String>,
}

/// Reads every check of a run from `dir/criteria.parquet`; the judge columns are read when
/// the table has them (runs of versions without judges have none).
pub fn read_checks(dir: &Path) -> Result<Vec<CheckRow>, CalibrationError> {
    let path = dir.join(crate::tables::CRITERIA_FILE);
    read_checks_file(&path).map_err(|source| CalibrationError::Criteria { path, source })
}

/// The columns of `criteria.parquet` a check is read from.
const CHECK_COLUMNS: [&str; 18] = [
    "run_id",
    "suite",
    "scenario",
    "trajectory",
    "agent",
    "repetition",
    "turn_index",
    "criterion",
    "kind",
    "status",
    "detail",
    "judge",
    "judge_provider",
    "judge_model",
    "rubric",
    "score",
    "threshold",
    "label",
];

fn read_checks_file(path: &Path) -> PolarsResult<Vec<CheckRow>> {
    let columns = crate::columns::read(path, &CHECK_COLUMNS)?;
    let height = columns.rows();
    let text = |name: &str| -> PolarsResult<Vec<Option<String>>> {
        if columns.has(name) {
            columns.strings(name)
        } else {
            Ok(vec![None; height])
        }
    };
    let required = |name: &str| columns.strings(name);
    let number = |name: &str| -> PolarsResult<Vec<Option<f64>>> {
        if columns.has(name) {
            columns.floats(name)
        } else {
            Ok(vec![None; height])
        }
    };
    let count = |name: &str| -> PolarsResult<Vec<Option<u32>>> {
        Ok(columns
            .unsigned(name)?
            .into_iter()
            .map(|n| n.and_then(|n| u32::try_from(n).ok()))
            .collect())
    };
    let (run_id, suite, scenario, trajectory, agent) = (
        required("run_id")?,
        required("suite")?,
        required("scenario")?,
        required("trajectory")?,
        required("agent")?,
    );
    let (repetition, turn_index) = (count("repetition")?, count("turn_index")?);
    let (criterion, kind, status, detail) = (
        required("criterion")?,
        required("kind")?,
        required("status")?,
        text("detail")?,
    );
    let (judge, judge_provider, judge_model, rubric, label) = (
        text("judge")?,
        text("judge_provider")?,
        text("judge_model")?,
        text("rubric")?,
        text("label")?,
    );
    let (score, threshold) = (number("score")?, number("threshold")?);
    let at = |v: &Vec<Option<String>>, i: usize| v.get(i).cloned().flatten();
    Ok((0..height)
        .map(|i| CheckRow {
            run_id: at(&run_id, i).unwrap_or_default(),
            suite: at(&suite, i).unwrap_or_default(),
            scenario: at(&scenario, i).unwrap_or_default(),
            trajectory: at(&trajectory, i).unwrap_or_default(),
            agent: at(&agent, i).unwrap_or_default(),
            repetition: repetition.get(i).copied().flatten().unwrap_or_default(),
            turn_index: turn_index.get(i).copied().flatten(),
            criterion: at(&criterion, i).unwrap_or_default(),
            kind: at(&kind, i).unwrap_or_default(),
            status: at(&status, i).unwrap_or_default(),
            detail: at(&detail, i),
            judge: at(&judge, i),
            judge_provider: at(&judge_provider, i),
            judge_model: at(&judge_model, i),
            rubric: at(&rubric, i),
            score: score.get(i).copied().flatten().filter(|s| s.is_finite()),
            threshold: threshold
                .get(i)
                .copied()
                .flatten()
                .filter(|s| s.is_finite()),
            label: at(&label, i),
        })
        .collect())
}

fn matches(label: &HumanLabel, row: &CheckRow) -> bool {
    label.criterion == row.criterion.trim() && matches_but_criterion(label, row)
}

/// A `judge` label whose check's text differs from the run's only after the statement (a
/// threshold, judge or rubric tuned since the label was written, then `rejudge`): matched
/// by the statement, as `rejudge` finds the check.
fn matches_statement(label: &HumanLabel, row: &CheckRow) -> bool {
    matches_but_criterion(label, row)
        && judge_statement(&label.criterion)
            .is_some_and(|head| judge_statement(row.criterion.trim()) == Some(head))
}

/// `judge "…"` (or `judge #"…"#`) at the start of a check's text: the check up to the end
/// of its statement.
fn judge_statement(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("judge ")?;
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    let body = rest[hashes..].strip_prefix('"')?;
    // A multi-line string (`"""`), joined onto one line in the check's text: not read.
    if body.starts_with("\"\"") {
        return None;
    }
    let start = text.len() - body.len();
    let end = if hashes == 0 {
        let mut escaped = false;
        body.char_indices().find_map(|(i, c)| {
            let closes = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            closes.then_some(i + 1)
        })?
    } else {
        let close = format!("\"{}", "#".repeat(hashes));
        body.find(&close)? + close.len()
    };
    Some(&text[..start + end])
}

fn matches_but_criterion(label: &HumanLabel, row: &CheckRow) -> bool {
    label.scenario == row.scenario
        && label.trajectory == row.trajectory
        && label.suite.as_ref().is_none_or(|s| *s == row.suite)
        && label.agent.as_ref().is_none_or(|a| *a == row.agent)
        && label.repetition.is_none_or(|r| r == row.repetition)
        && label.turn_index.is_none_or(|t| row.turn_index == Some(t))
}

fn check_ref(row: &CheckRow, detail: Option<String>) -> CheckRef {
    CheckRef {
        suite: row.suite.clone(),
        scenario: row.scenario.clone(),
        trajectory: row.trajectory.clone(),
        agent: row.agent.clone(),
        repetition: row.repetition,
        turn_index: row.turn_index,
        criterion: row.criterion.clone(),
        judge: row.judge.clone().unwrap_or_default(),
        status: row.status.clone(),
        detail,
    }
}

/// The judge's verdict on a check as a category: `pass` or `fail`.
fn verdict(row: &CheckRow) -> &'static str {
    let passed = match (row.status.as_str(), row.score) {
        ("passed", _) => true,
        // Skipped with the judge's answer kept (its trajectory turned out invalid): the
        // verdict the answer gave. A panel's is its label (its score is the share of its
        // members that passed, which its rule, not its threshold, turns into a verdict).
        ("skipped", Some(score)) => match row.label.as_deref().map(str::trim) {
            Some(label) if label.eq_ignore_ascii_case("pass") => true,
            Some(label) if label.eq_ignore_ascii_case("fail") => false,
            _ => score >= row.threshold.unwrap_or(0.5),
        },
        _ => false,
    };
    if passed { "pass" } else { "fail" }
}

/// Whether the check's judge gave it an answer to compare: it passed or failed, or it was
/// skipped after the judge answered (a trajectory whose simulated user broke character
/// keeps its judges' answers). An error, or a skip the judge never answered, has none.
fn answered(row: &CheckRow) -> bool {
    match row.status.as_str() {
        "error" => false,
        "skipped" => row.score.is_some(),
        _ => true,
    }
}

/// Joins `labels` with the judged checks among `checks` and measures each judge's
/// agreement per rubric. Categories: a human `pass`/`fail` (the documented vocabulary) is
/// compared with the judge's verdict; any other human `label` with the judge's `label` (or,
/// when the judge gave none, its verdict), case-insensitively; a human who gave only a
/// score is turned into `pass`/`fail` by the check's threshold and compared with the
/// judge's verdict. Labels that share no category with any label the judge gave on that
/// rubric in the run are an error: their agreement would be 0 by construction.
pub fn calibrate(
    run_id: &str,
    labels_file: &str,
    checks: &[CheckRow],
    labels: &[HumanLabel],
    floors: Floors,
) -> Result<Calibration, CalibrationError> {
    let judged: Vec<&CheckRow> = checks.iter().filter(|c| c.judge.is_some()).collect();
    let mut labelled: BTreeMap<usize, usize> = BTreeMap::new();
    let mut unmatched_labels = Vec::new();
    let unused = |l: &HumanLabel, why: String| UnusedLabel {
        line: l.line,
        scenario: l.scenario.clone(),
        trajectory: l.trajectory.clone(),
        criterion: l.criterion.clone(),
        why,
    };
    // A label matches only rows of its scenario and trajectory: each is compared with those,
    // in the run's order, not with every check (20,000 labels against 40,000 checks took 5.8
    // s).
    let mut judged_at: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, row) in judged.iter().enumerate() {
        judged_at
            .entry((&row.scenario, &row.trajectory))
            .or_default()
            .push(i);
    }
    let mut checks_at: HashMap<(&str, &str), Vec<&CheckRow>> = HashMap::new();
    for row in checks {
        checks_at
            .entry((&row.scenario, &row.trajectory))
            .or_default()
            .push(row);
    }
    for (index, label) in labels.iter().enumerate() {
        let key = (label.scenario.as_str(), label.trajectory.as_str());
        let near = judged_at.get(&key).map_or(&[][..], Vec::as_slice);
        let hits_by = |matches: fn(&HumanLabel, &CheckRow) -> bool| -> Vec<usize> {
            near.iter()
                .copied()
                .filter(|&i| matches(label, judged[i]))
                .collect()
        };
        let mut hits = hits_by(matches);
        if hits.is_empty() {
            hits = hits_by(matches_statement);
        }
        match hits.as_slice() {
            [] => {
                let same_place = checks_at.get(&key).map_or(&[][..], Vec::as_slice);
                let why = match same_place.iter().find(|row| matches(label, row)) {
                    Some(row) => format!(
                        "the check is not LLM-judged in this run (kind `{}`, status `{}`)",
                        row.kind, row.status
                    ),
                    None => "no check of the run matches it".to_owned(),
                };
                unmatched_labels.push(unused(label, why));
            }
            [hit] => match labelled.get(hit) {
                Some(&first) => {
                    let line = labels.get(first).map_or(0, |l| l.line);
                    unmatched_labels.push(unused(
                        label,
                        format!("the check already has the label on line {line}"),
                    ));
                }
                None => {
                    labelled.insert(*hit, index);
                }
            },
            many => unmatched_labels.push(unused(
                label,
                format!(
                    "matches {} judged checks: give suite, agent, repetition or turn_index",
                    many.len()
                ),
            )),
        }
    }

    // Every category each judge gave per rubric, over the whole run.
    let mut judge_vocabulary: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for row in &judged {
        let key = (
            row.judge.clone().unwrap_or_default(),
            row.rubric.clone().unwrap_or_default(),
        );
        let vocabulary = judge_vocabulary.entry(key).or_default();
        if let Some(label) = row.label.as_deref().map(|l| l.trim().to_lowercase())
            && !label.is_empty()
        {
            vocabulary.insert(label);
        }
    }

    struct Group<'a> {
        provider: Option<String>,
        model: Option<String>,
        categories: Vec<(String, String)>,
        /// Human categories compared with the judge's own labels (not its verdict).
        against_labels: BTreeSet<String>,
        scores: Vec<(f64, f64)>,
        rows: Vec<&'a CheckRow>,
    }
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let mut judge_errors = Vec::new();
    let mut unlabeled_checks = Vec::new();
    for (i, row) in judged.iter().enumerate() {
        let Some(label) = labelled.get(&i).and_then(|&l| labels.get(l)) else {
            unlabeled_checks.push(check_ref(row, None));
            continue;
        };
        if !answered(row) {
            judge_errors.push(check_ref(row, row.detail.clone()));
            continue;
        }
        let key = (
            row.judge.clone().unwrap_or_default(),
            row.rubric.clone().unwrap_or_default(),
        );
        let group = groups.entry(key).or_insert_with(|| Group {
            provider: row.judge_provider.clone(),
            model: row.judge_model.clone(),
            categories: Vec::new(),
            against_labels: BTreeSet::new(),
            scores: Vec::new(),
            rows: Vec::new(),
        });
        group.rows.push(row);
        let category = match label.label.as_deref().map(|l| l.trim().to_lowercase()) {
            Some(human) if human == "pass" || human == "fail" => (human, verdict(row).to_owned()),
            Some(human) => match row.label.as_deref().map(|l| l.trim().to_lowercase()) {
                Some(judged) if !judged.is_empty() => {
                    group.against_labels.insert(human.clone());
                    (human, judged)
                }
                _ => (human, verdict(row).to_owned()),
            },
            None => {
                let threshold = row.threshold.unwrap_or(0.5);
                let human = if label.score.unwrap_or(0.0) >= threshold {
                    "pass"
                } else {
                    "fail"
                };
                (human.to_owned(), verdict(row).to_owned())
            }
        };
        group.categories.push(category);
        if let (Some(h), Some(j)) = (label.score, row.score) {
            group.scores.push((h, j));
        }
    }

    for ((judge, rubric), group) in &groups {
        let Some(judged) = judge_vocabulary.get(&(judge.clone(), rubric.clone())) else {
            continue;
        };
        if !group.against_labels.is_empty() && group.against_labels.is_disjoint(judged) {
            let list = |set: &BTreeSet<String>| {
                set.iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(CalibrationError::Vocabulary {
                labels_file: labels_file.to_owned(),
                judge: judge.clone(),
                rubric: rubric.clone(),
                human: list(&group.against_labels),
                judged: list(judged),
            });
        }
    }

    let judges: Vec<JudgeAgreement> = groups
        .into_iter()
        .map(|((judge, rubric), g)| {
            let kappa = calibrate::cohen_kappa(&g.categories);
            let pearson = calibrate::pearson(&g.scores);
            let (trust, reasons) = trust(&kappa, &pearson, &floors);
            JudgeAgreement {
                judge,
                provider: g.provider,
                model: g.model,
                rubric,
                n: g.rows.len(),
                scored: g.scores.len(),
                agreement: calibrate::raw_agreement(&g.categories),
                spearman: calibrate::spearman(&g.scores),
                mae: calibrate::mean_absolute_error(&g.scores),
                kappa,
                pearson,
                trust,
                reasons,
            }
        })
        .collect();
    let mut below_floor: Vec<String> = judges
        .iter()
        .filter(|j| j.trust == Trust::BelowFloor)
        .map(|j| j.judge.clone())
        .collect();
    below_floor.dedup();
    Ok(Calibration {
        schema_version: CALIBRATION_SCHEMA_VERSION,
        run_id: run_id.to_owned(),
        labels_file: labels_file.to_owned(),
        floors,
        judged_checks: judged.len(),
        labels: labels.len(),
        matched: labelled.len(),
        judges,
        below_floor,
        unmatched_labels,
        unlabeled_checks,
        judge_errors,
    })
}

/// How far below a floor a figure may be and still meet it: a figure computed in floating
/// point lands a last bit under the value it stands for (a Pearson r of exactly 0.6 read
/// 0.5999999999999999, "below 0.6"), and the floors are written to a few decimals.
const FLOOR_ROUNDING: f64 = 1e-9;

fn trust(kappa: &Figure, pearson: &Figure, floors: &Floors) -> (Trust, Vec<String>) {
    let mut below = Vec::new();
    let mut unchecked = Vec::new();
    let mut checked = 0;
    match kappa.value {
        Some(k) => {
            checked += 1;
            if k < floors.min_kappa - FLOOR_ROUNDING {
                let why = kappa
                    .note
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                below.push(format!("kappa {k:.3} is below {}{why}", floors.min_kappa));
            }
        }
        None => unchecked.push(format!(
            "kappa not computed: {}",
            kappa.note.as_deref().unwrap_or("no pairs")
        )),
    }
    if let Some(min) = floors.min_correlation {
        match pearson.value {
            Some(r) => {
                checked += 1;
                if r < min - FLOOR_ROUNDING {
                    below.push(format!("Pearson r {r:.3} is below {min}"));
                }
            }
            None => unchecked.push(format!(
                "Pearson r not computed: {}",
                pearson.note.as_deref().unwrap_or("no pairs")
            )),
        }
    }
    if !below.is_empty() {
        below.extend(unchecked);
        (Trust::BelowFloor, below)
    } else if checked == 0 {
        (Trust::NotEstablished, unchecked)
    } else {
        (Trust::Trusted, unchecked)
    }
}

/// Calibrates the run in `dir` against `labels` and writes `dir/calibration.json`.
pub fn calibrate_run(
    dir: &Path,
    labels_file: &Path,
    labels: &[HumanLabel],
    floors: Floors,
) -> Result<Calibration, CalibrationError> {
    let checks = read_checks(dir)?;
    if !checks.iter().any(|c| c.judge.is_some()) {
        return Err(CalibrationError::NoJudgedChecks {
            path: dir.join(crate::tables::CRITERIA_FILE),
        });
    }
    let run_id = checks.first().map(|c| c.run_id.clone()).unwrap_or_default();
    calibrate(
        &run_id,
        &labels_file.display().to_string(),
        &checks,
        labels,
        floors,
    )
}

/// A judge a run's `calibration.json` marks below the agreement floor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UntrustedJudge {
    pub run_id: String,
    pub judge: String,
    /// `calibration.json` it was read from.
    pub file: String,
}

/// Reads `dir/calibration.json`; `Ok(None)` when the run was never calibrated.
pub fn read_calibration(dir: &Path) -> Result<Option<Calibration>, CalibrationError> {
    let path = dir.join(CALIBRATION_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CalibrationError::BadCalibration { path, source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| CalibrationError::BadCalibration {
            path,
            source: e.into(),
        })
}

/// The judges `dir/calibration.json` marks below the floor (none when there is no file).
pub fn untrusted_judges(dir: &Path) -> Result<Vec<UntrustedJudge>, CalibrationError> {
    let file = dir.join(CALIBRATION_FILE).display().to_string();
    Ok(read_calibration(dir)?
        .map(|c| {
            c.below_floor
                .iter()
                .map(|judge| UntrustedJudge {
                    run_id: c.run_id.clone(),
                    judge: judge.clone(),
                    file: file.clone(),
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_a_rounding_below_its_floor_meets_it() {
        let figure = |v: f64| Figure {
            value: Some(v),
            ..Figure::default()
        };
        let floors = Floors {
            min_kappa: 0.6,
            min_correlation: Some(0.6),
        };
        let (trust_at, _) = trust(&figure(0.6), &figure(0.599_999_999_999_999_9), &floors);
        assert_eq!(trust_at, Trust::Trusted);
        let (trust_under, why) = trust(&figure(0.59), &figure(0.7), &floors);
        assert_eq!(trust_under, Trust::BelowFloor);
        assert_eq!(why, ["kappa 0.590 is below 0.6"]);
    }

    fn check(trajectory: &str, judge: &str, status: &str, score: f64, label: &str) -> CheckRow {
        CheckRow {
            run_id: "r".into(),
            suite: "s".into(),
            scenario: "c".into(),
            trajectory: trajectory.into(),
            agent: "a".into(),
            turn_index: Some(1),
            criterion: "judge polite".into(),
            kind: "judge".into(),
            status: status.into(),
            judge: Some(judge.into()),
            rubric: Some("generic".into()),
            score: Some(score),
            threshold: Some(0.5),
            label: Some(label.into()),
            ..CheckRow::default()
        }
    }

    fn human(line: usize, trajectory: &str, score: f64, label: Option<&str>) -> HumanLabel {
        HumanLabel {
            line,
            scenario: "c".into(),
            trajectory: trajectory.into(),
            criterion: "judge polite".into(),
            score: Some(score),
            label: label.map(str::to_owned),
            ..HumanLabel::default()
        }
    }

    /// A check skipped after its judge answered (its trajectory was invalid) is compared
    /// by the answer's verdict; one skipped unjudged, or in error, is listed as unanswered.
    #[test]
    fn a_skipped_check_counts_when_its_judge_answered() {
        let checks = vec![
            check("t1", "j", "passed", 0.9, "pass"),
            check("t2", "j", "failed", 0.1, "fail"),
            check("t3", "j", "skipped", 0.8, "pass"),
            check("t4", "j", "skipped", 0.2, "fail"),
            CheckRow {
                score: None,
                label: None,
                detail: Some("not checked: not sent: --max-llm-calls 3".into()),
                ..check("t5", "j", "skipped", 0.0, "")
            },
            CheckRow {
                score: None,
                label: None,
                ..check("t6", "j", "error", 0.0, "")
            },
        ];
        // A panel's score is the share of its members that passed: 2 of 3 under a 0.7
        // threshold, and its label says it passed.
        let mut checks = checks;
        checks.push(CheckRow {
            threshold: Some(0.7),
            ..check("t7", "j", "skipped", 2.0 / 3.0, "pass")
        });
        let labels = vec![
            human(2, "t1", 1.0, Some("pass")),
            human(3, "t2", 0.0, Some("fail")),
            human(4, "t3", 1.0, Some("pass")),
            human(5, "t4", 0.0, Some("fail")),
            human(6, "t5", 1.0, Some("pass")),
            human(7, "t6", 1.0, Some("pass")),
            human(8, "t7", 1.0, Some("pass")),
        ];
        let c = calibrate("r", "l.csv", &checks, &labels, Floors::default()).unwrap();
        let j = &c.judges[0];
        assert_eq!((j.n, j.scored), (5, 5));
        assert_eq!(j.agreement.value, Some(1.0));
        let unanswered: Vec<(&str, &str)> = c
            .judge_errors
            .iter()
            .map(|k| (k.trajectory.as_str(), k.status.as_str()))
            .collect();
        assert_eq!(unanswered, [("t5", "skipped"), ("t6", "error")]);
    }

    #[test]
    fn a_judge_label_matches_its_check_after_the_threshold_changed() {
        let tuned = |trajectory: &str, criterion: &str| CheckRow {
            criterion: criterion.into(),
            ..check(trajectory, "good", "passed", 0.9, "pass")
        };
        let checks = vec![
            tuned("t1", r#"judge "is \"polite\"" threshold=0.95"#),
            tuned("t2", r##"judge #"is "kind""# judge="strict""##),
            tuned("t3", r#"judge "is polite, really" threshold=0.95"#),
        ];
        let label = |line: usize, trajectory: &str, criterion: &str| HumanLabel {
            criterion: criterion.into(),
            ..human(line, trajectory, 1.0, None)
        };
        let labels = vec![
            label(2, "t1", r#"judge "is \"polite\"" threshold=0.8"#),
            label(3, "t2", r##"judge #"is "kind""#"##),
            // Another statement: not the check.
            label(4, "t3", r#"judge "is polite" threshold=0.95"#),
        ];
        let c = calibrate("r", "l.csv", &checks, &labels, Floors::default()).unwrap();
        assert_eq!(c.matched, 2, "{:?}", c.unmatched_labels);
        assert_eq!(c.unmatched_labels.len(), 1);
        assert_eq!(c.unmatched_labels[0].line, 4);
        assert_eq!(judge_statement("judge polite"), None);
        assert_eq!(judge_statement(r#"judge """ is polite """ x=1"#), None);
        assert_eq!(judge_statement(r##"judge #""" is polite """# x=1"##), None);
        assert_eq!(
            judge_statement(r#"judge "a\\" x=1"#),
            Some(r#"judge "a\\""#)
        );
    }

    #[test]
    fn agreement_per_judge_with_every_label_accounted_for() {
        let checks = vec![
            check("t1", "good", "passed", 0.9, "pass"),
            check("t2", "good", "failed", 0.1, "fail"),
            check("t3", "good", "passed", 0.8, "pass"),
            check("t4", "good", "failed", 0.2, "fail"),
            check("t5", "good", "error", 0.0, "fail"),
            check("t6", "good", "passed", 0.7, "pass"),
            CheckRow {
                kind: "reply".into(),
                judge: None,
                trajectory: "t9".into(),
                criterion: "judge polite".into(),
                scenario: "c".into(),
                ..CheckRow::default()
            },
        ];
        let labels = vec![
            human(2, "t1", 1.0, Some("PASS")),
            human(3, "t2", 0.0, None),
            human(4, "t3", 0.9, None),
            human(5, "t4", 0.3, Some("fail")),
            human(6, "t5", 0.3, None),
            human(7, "t1", 0.5, None),
            human(8, "nowhere", 0.5, None),
            human(9, "t9", 0.5, None),
        ];
        let c = calibrate("r", "l.csv", &checks, &labels, Floors::default()).unwrap();
        assert_eq!((c.judged_checks, c.labels, c.matched), (6, 8, 5));
        let j = &c.judges[0];
        assert_eq!((j.n, j.scored), (4, 4));
        assert_eq!(j.kappa.value, Some(1.0));
        assert_eq!(j.trust, Trust::Trusted);
        assert_eq!(c.judge_errors.len(), 1);
        assert_eq!(c.unlabeled_checks.len(), 1);
        assert_eq!(c.unlabeled_checks[0].trajectory, "t6");
        let why: Vec<(usize, &str)> = c
            .unmatched_labels
            .iter()
            .map(|u| (u.line, u.why.as_str()))
            .collect();
        assert_eq!(why[0], (7, "the check already has the label on line 2"));
        assert_eq!(why[1], (8, "no check of the run matches it"));
        assert!(why[2].1.contains("not LLM-judged"), "{why:?}");
    }

    #[test]
    fn a_judge_that_disagrees_is_below_the_floor_and_ambiguity_is_listed() {
        let mut checks: Vec<CheckRow> = (0..6)
            .map(|i| {
                check(
                    &format!("t{i}"),
                    "bad",
                    if i % 2 == 0 { "passed" } else { "failed" },
                    0.5,
                    "x",
                )
            })
            .collect();
        checks.iter_mut().for_each(|c| c.label = None);
        // The human disagrees on 4 of 6: kappa is negative.
        let labels: Vec<HumanLabel> = (0..6)
            .map(|i| {
                human(
                    i + 1,
                    &format!("t{i}"),
                    if i < 4 {
                        if i % 2 == 0 { 0.0 } else { 1.0 }
                    } else if i % 2 == 0 {
                        1.0
                    } else {
                        0.0
                    },
                    None,
                )
            })
            .collect();
        let c = calibrate("r", "l", &checks, &labels, Floors::default()).unwrap();
        assert_eq!(c.below_floor, ["bad"]);
        assert_eq!(c.judges[0].trust, Trust::BelowFloor);
        assert!(c.judges[0].reasons[0].contains("below 0.6"));
        // The judge gave every check 0.5: no correlation, said so.
        assert!(
            c.judges[0]
                .pearson
                .note
                .as_deref()
                .unwrap()
                .contains("judge gave every item")
        );

        let mut twice = checks.clone();
        twice.push(CheckRow {
            agent: "b".into(),
            ..checks[0].clone()
        });
        let c = calibrate("r", "l", &twice, &labels[..1], Floors::default()).unwrap();
        assert!(
            c.unmatched_labels[0]
                .why
                .contains("matches 2 judged checks")
        );
        assert_eq!(c.judges.len(), 0);
    }

    /// Eight outcome checks whose judge labels are `holds`/`does not hold`.
    fn outcome_checks() -> Vec<CheckRow> {
        (0..8)
            .map(|i| {
                let holds = i % 2 == 0;
                check(
                    &format!("t{i}"),
                    "j",
                    if holds { "passed" } else { "failed" },
                    if holds { 0.9 } else { 0.1 },
                    if holds { "holds" } else { "does not hold" },
                )
            })
            .collect()
    }

    #[test]
    fn pass_and_fail_labels_are_compared_with_the_judges_verdict() {
        let checks = outcome_checks();
        // The human agrees with the verdict on 7 of 8, in any case.
        let labels: Vec<HumanLabel> = (0..8)
            .map(|i| {
                let pass = (i % 2 == 0) != (i == 3);
                let mut l = human(i + 2, &format!("t{i}"), 0.0, None);
                l.score = None;
                l.label = Some(if pass { "PASS" } else { "fail" }.to_owned());
                l
            })
            .collect();
        let c = calibrate("r", "l", &checks, &labels, Floors::default()).unwrap();
        assert_eq!(c.judges[0].agreement.value, Some(0.875));
        assert!(c.judges[0].kappa.value.unwrap() > 0.7);
        assert!(c.below_floor.is_empty());
    }

    #[test]
    fn labels_sharing_nothing_with_the_judges_are_an_error_naming_both() {
        let checks = outcome_checks();
        let labels: Vec<HumanLabel> = (0..8)
            .map(|i| {
                let mut l = human(i + 2, &format!("t{i}"), 0.0, None);
                l.score = None;
                l.label = Some(if i % 2 == 0 { "yes" } else { "no" }.to_owned());
                l
            })
            .collect();
        let e = calibrate("r", "l.csv", &checks, &labels, Floors::default()).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`no`, `yes`"), "{text}");
        assert!(text.contains("`does not hold`, `holds`"), "{text}");
        // Labels in the judge's own vocabulary are compared with its labels.
        let own: Vec<HumanLabel> = labels
            .into_iter()
            .map(|mut l| {
                l.label = l
                    .label
                    .map(|y| if y == "yes" { "holds" } else { "does not hold" }.to_owned());
                l
            })
            .collect();
        let c = calibrate("r", "l.csv", &checks, &own, Floors::default()).unwrap();
        assert_eq!(c.judges[0].agreement.value, Some(1.0));
    }

    #[test]
    fn too_few_labels_do_not_establish_trust() {
        let checks = vec![check("t1", "j", "passed", 0.9, "pass")];
        let c = calibrate(
            "r",
            "l",
            &checks,
            &[human(1, "t1", 1.0, None)],
            Floors {
                min_kappa: 0.6,
                min_correlation: Some(0.5),
            },
        )
        .unwrap();
        assert_eq!(c.judges[0].trust, Trust::NotEstablished);
        assert!(c.below_floor.is_empty());
        assert_eq!(c.judges[0].reasons.len(), 2);
    }
}
