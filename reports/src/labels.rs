//! Human labels for `trellis calibrate`: what a person said about a judged check, read from
//! CSV, JSON Lines or KDL (by file extension). The columns/keys are documented in
//! `docs/results.md` ("Human labels"). Every bad row is reported with its line (and, for
//! KDL, its span), all at once, so a labelling spreadsheet is fixed in one pass.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use miette::{NamedSource, SourceSpan};
use trellis_dsl::{CharColumns, SourceFile};

/// One human judgement of one check of one trajectory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HumanLabel {
    /// 1-based line of the row in the labels file.
    pub line: usize,
    /// `None` matches any suite (the run has to make it unambiguous).
    pub suite: Option<String>,
    pub scenario: String,
    pub trajectory: String,
    /// `None` matches any agent.
    pub agent: Option<String>,
    /// `None` matches any repetition.
    pub repetition: Option<u32>,
    /// The turn an `expect` checked (`criteria.turn_index`); `None` matches any turn.
    pub turn_index: Option<u32>,
    /// The criterion as written in the suite (`criteria.criterion`).
    pub criterion: String,
    /// 0–1.
    pub score: Option<f64>,
    /// A category (`pass`, `fail`, …), compared with the judge's label case-insensitively.
    pub label: Option<String>,
}

/// One bad row of a CSV or JSONL labels file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRow {
    pub line: usize,
    pub message: String,
}

/// One bad node of a KDL labels file.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{message}")]
#[diagnostic(code(trellis::labels::bad_node))]
pub struct BadNode {
    message: String,
    #[label("{label}")]
    span: SourceSpan,
    label: String,
    #[help]
    help: Option<String>,
}

/// Why a labels file could not be read.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LabelsError {
    #[error("cannot read the labels file {}", path.display())]
    #[diagnostic(code(trellis::labels::io))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: unknown labels format", path.display())]
    #[diagnostic(
        code(trellis::labels::format),
        help("name the file *.csv, *.jsonl (or *.ndjson) or *.kdl")
    )]
    UnknownFormat { path: PathBuf },

    #[error("{}: {}", path.display(), list_rows(rows))]
    #[diagnostic(
        code(trellis::labels::bad_rows),
        help(
            "each row needs scenario, trajectory and criterion, and a score (0–1) and/or a \
             label; suite, agent, repetition and turn_index are optional"
        )
    )]
    BadRows { path: PathBuf, rows: Vec<BadRow> },

    #[error("{} has {} bad label node{}", path.display(), problems.len(), if problems.len() == 1 { "" } else { "s" })]
    #[diagnostic(code(trellis::labels::bad_kdl))]
    BadKdl {
        path: PathBuf,
        #[source_code]
        src: NamedSource<CharColumns>,
        #[related]
        problems: Vec<BadNode>,
    },

    #[error("{} is not a KDL document", path.display())]
    #[diagnostic(code(trellis::labels::kdl_syntax))]
    KdlSyntax {
        path: PathBuf,
        #[source_code]
        src: NamedSource<CharColumns>,
        #[related]
        problems: Vec<BadNode>,
    },

    #[error("{} holds no labels", path.display())]
    #[diagnostic(
        code(trellis::labels::empty),
        help("add one row (or `label` node) per judged check a person has scored")
    )]
    Empty { path: PathBuf },
}

/// The 1-based line of a byte offset in a labels file. Found from where its line ends are:
/// counting them from the file's start for each row took 54 s for a CSV of 100,000 labels.
struct LineNumbers(Vec<usize>);

impl LineNumbers {
    fn of(text: &str) -> Self {
        LineNumbers(
            text.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
        )
    }

    /// One more than the line ends before `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.0.partition_point(|&end| end < offset) + 1
    }
}

fn list_rows(rows: &[BadRow]) -> String {
    let mut text = format!(
        "{} bad row{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    for row in rows {
        text.push_str(&format!("\n  line {}: {}", row.line, row.message));
    }
    text
}

/// Reads a labels file; the format is chosen by extension (`.csv`, `.jsonl`/`.ndjson`,
/// `.kdl`).
pub fn read_labels(path: &Path) -> Result<Vec<HumanLabel>, LabelsError> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let parse: fn(&Path, &str) -> Result<Vec<HumanLabel>, LabelsError> = match extension.as_deref()
    {
        Some("csv") => parse_csv,
        Some("jsonl" | "ndjson") => parse_jsonl,
        Some("kdl") => parse_kdl,
        _ => {
            return Err(LabelsError::UnknownFormat {
                path: path.to_path_buf(),
            });
        }
    };
    let text = std::fs::read_to_string(path).map_err(|source| LabelsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let labels = parse(path, &text)?;
    if labels.is_empty() {
        return Err(LabelsError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(labels)
}

/// The fields of one row before they are checked, whatever the format.
#[derive(Default)]
struct RawRow {
    suite: Option<String>,
    scenario: Option<String>,
    trajectory: Option<String>,
    agent: Option<String>,
    repetition: Option<u32>,
    turn_index: Option<u32>,
    criterion: Option<String>,
    score: Option<f64>,
    label: Option<String>,
}

/// Checks what every format needs: the key fields, a score in 0–1 and/or a label.
fn finish(row: RawRow, line: usize) -> Result<HumanLabel, String> {
    let mut missing = Vec::new();
    for (name, value) in [
        ("scenario", &row.scenario),
        ("trajectory", &row.trajectory),
        ("criterion", &row.criterion),
    ] {
        if value.is_none() {
            missing.push(name);
        }
    }
    if !missing.is_empty() {
        return Err(format!("missing {}", missing.join(", ")));
    }
    if let Some(score) = row.score
        && !(0.0..=1.0).contains(&score)
    {
        return Err(format!("score {score} is not between 0 and 1"));
    }
    if row.score.is_none() && row.label.is_none() {
        return Err("neither a score nor a label".into());
    }
    Ok(HumanLabel {
        line,
        suite: row.suite,
        scenario: row.scenario.unwrap_or_default(),
        trajectory: row.trajectory.unwrap_or_default(),
        agent: row.agent,
        repetition: row.repetition,
        turn_index: row.turn_index,
        criterion: row.criterion.unwrap_or_default(),
        score: row.score,
        label: row.label,
    })
}

/// A non-empty text, trimmed.
fn text(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

fn whole_number(field: &str, value: &str) -> Result<Option<u32>, String> {
    match text(value) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{field} `{v}` is not a whole number of at least 0")),
    }
}

fn score_of(value: &str) -> Result<Option<f64>, String> {
    match text(value) {
        None => Ok(None),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() => Ok(Some(s)),
            _ => Err(format!("score `{v}` is not a number")),
        },
    }
}

fn parse_csv(path: &Path, text_in: &str) -> Result<Vec<HumanLabel>, LabelsError> {
    let bad = |rows| LabelsError::BadRows {
        path: path.to_path_buf(),
        rows,
    };
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(text_in.as_bytes());
    let headers = match reader.headers() {
        Ok(h) => h.clone(),
        Err(e) => {
            return Err(bad(vec![BadRow {
                line: 1,
                message: e.to_string(),
            }]));
        }
    };
    let column = |name: &str| headers.iter().position(|h| h.trim() == name);
    let missing: Vec<&str> = ["scenario", "trajectory", "criterion"]
        .into_iter()
        .filter(|c| column(c).is_none())
        .collect();
    if !missing.is_empty() || (column("score").is_none() && column("label").is_none()) {
        let mut needed: Vec<&str> = missing;
        if column("score").is_none() && column("label").is_none() {
            needed.push("score or label");
        }
        return Err(bad(vec![BadRow {
            line: 1,
            message: format!("the header has no {} column", needed.join(", ")),
        }]));
    }
    let (suite, scenario, trajectory, agent) = (
        column("suite"),
        column("scenario"),
        column("trajectory"),
        column("agent"),
    );
    let (repetition, turn, criterion, score, label) = (
        column("repetition"),
        column("turn_index"),
        column("criterion"),
        column("score"),
        column("label"),
    );
    // From the byte offset: the reader's own line count skips blank lines, and a record's
    // offset is where the blank lines before it start.
    let lines = LineNumbers::of(text_in);
    let line_at = |p: Option<&csv::Position>| {
        let byte = p.and_then(|p| usize::try_from(p.byte()).ok())?;
        let blank = text_in
            .get(byte..)?
            .bytes()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        Some(lines.line_of(byte + blank))
    };
    let mut labels = Vec::new();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                let line = line_at(e.position()).unwrap_or(0);
                rows.push(BadRow {
                    line,
                    message: e.to_string(),
                });
                continue;
            }
        };
        let line = line_at(record.position()).unwrap_or(0);
        let field = |c: Option<usize>| c.and_then(|c| record.get(c)).unwrap_or("");
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        let parsed = (|| {
            let raw = RawRow {
                suite: text(field(suite)),
                scenario: text(field(scenario)),
                trajectory: text(field(trajectory)),
                agent: text(field(agent)),
                repetition: whole_number("repetition", field(repetition))?,
                turn_index: whole_number("turn_index", field(turn))?,
                criterion: text(field(criterion)),
                score: score_of(field(score))?,
                label: text(field(label)),
            };
            finish(raw, line)
        })();
        match parsed {
            Ok(l) => labels.push(l),
            Err(message) => rows.push(BadRow { line, message }),
        }
    }
    if rows.is_empty() {
        Ok(labels)
    } else {
        Err(bad(rows))
    }
}

fn parse_jsonl(path: &Path, text_in: &str) -> Result<Vec<HumanLabel>, LabelsError> {
    let mut labels = Vec::new();
    let mut rows = Vec::new();
    for (index, line_text) in text_in.lines().enumerate() {
        let line = index + 1;
        if line_text.trim().is_empty() {
            continue;
        }
        match json_row(line_text).and_then(|raw| finish(raw, line)) {
            Ok(l) => labels.push(l),
            Err(message) => rows.push(BadRow { line, message }),
        }
    }
    if rows.is_empty() {
        Ok(labels)
    } else {
        Err(LabelsError::BadRows {
            path: path.to_path_buf(),
            rows,
        })
    }
}

fn json_row(line: &str) -> Result<RawRow, String> {
    use serde_json::Value;
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let Value::Object(object) = value else {
        return Err("not a JSON object".into());
    };
    let string = |key: &str| -> Result<Option<String>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(text(s)),
            Some(other) => Err(format!("{key} is not a string: {other}")),
        }
    };
    let number = |key: &str| -> Result<Option<u32>, String> {
        match object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| format!("{key} is not a whole number of at least 0: {v}")),
        }
    };
    let score = match object.get("score") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| format!("score is not a number: {v}"))?,
        ),
    };
    Ok(RawRow {
        suite: string("suite")?,
        scenario: string("scenario")?,
        trajectory: string("trajectory")?,
        agent: string("agent")?,
        repetition: number("repetition")?,
        turn_index: number("turn_index")?,
        criterion: string("criterion")?,
        score,
        label: string("label")?,
    })
}

fn parse_kdl(path: &Path, text_in: &str) -> Result<Vec<HumanLabel>, LabelsError> {
    // Drawn from the lines around each span, not read from the file's start for each of
    // them (trellis_dsl's `CharColumns`), and columns counted in characters as for suites.
    let file = SourceFile::new(
        path.to_path_buf(),
        path.display().to_string(),
        Arc::from(text_in),
    );
    let source = || file.named_source();
    let document = match kdl::KdlDocument::parse_v2(text_in) {
        Ok(d) => d,
        Err(e) => {
            return Err(LabelsError::KdlSyntax {
                path: path.to_path_buf(),
                src: source(),
                problems: e
                    .diagnostics
                    .into_iter()
                    .map(|d| BadNode {
                        message: d.message.unwrap_or_else(|| "invalid KDL".into()),
                        span: d.span,
                        label: d.label.unwrap_or_else(|| "here".into()),
                        help: Some(
                            d.help
                                .unwrap_or_else(|| "labels files are KDL v2 documents".into()),
                        ),
                    })
                    .collect(),
            });
        }
    };
    let lines = LineNumbers::of(text_in);
    let line_of = |offset: usize| lines.line_of(offset);
    let mut labels = Vec::new();
    let mut problems = Vec::new();
    for node in document.nodes() {
        let name = node.name().value();
        if name != "label" {
            problems.push(BadNode {
                message: format!("unknown node `{name}`"),
                span: node.name().span(),
                label: "not `label`".into(),
                help: Some(
                    "a labels file is a list of `label scenario=… trajectory=… criterion=… \
                     score=…` nodes"
                        .into(),
                ),
            });
            continue;
        }
        let mut raw = RawRow::default();
        let mut node_problems = Vec::new();
        for entry in node.entries() {
            let Some(key) = entry.name().map(|n| n.value()) else {
                node_problems.push(BadNode {
                    message: "a label takes properties only".into(),
                    span: entry.span(),
                    label: "argument".into(),
                    help: Some("write key=value, such as scenario=\"booking\"".into()),
                });
                continue;
            };
            let value = entry.value();
            let problem = |what: &str| BadNode {
                message: format!("`{key}` must be {what}"),
                span: entry.span(),
                label: "here".into(),
                help: None,
            };
            let as_text = || value.as_string().and_then(text);
            let as_count = || {
                value
                    .as_integer()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
            };
            match key {
                "suite" | "scenario" | "trajectory" | "agent" | "criterion" | "label" => {
                    match as_text() {
                        Some(v) => {
                            let slot = match key {
                                "suite" => &mut raw.suite,
                                "scenario" => &mut raw.scenario,
                                "trajectory" => &mut raw.trajectory,
                                "agent" => &mut raw.agent,
                                "criterion" => &mut raw.criterion,
                                _ => &mut raw.label,
                            };
                            *slot = Some(v);
                        }
                        None => node_problems.push(problem("a non-empty string")),
                    }
                }
                "repetition" | "turn_index" => match as_count() {
                    Some(v) => {
                        if key == "repetition" {
                            raw.repetition = v;
                        } else {
                            raw.turn_index = v;
                        }
                    }
                    None => node_problems.push(problem("a whole number of at least 0")),
                },
                "score" => match value
                    .as_float()
                    .or_else(|| value.as_integer().map(|i| i as f64))
                {
                    Some(s) if (0.0..=1.0).contains(&s) => raw.score = Some(s),
                    _ => node_problems.push(problem("a number from 0 to 1")),
                },
                other => node_problems.push(BadNode {
                    message: format!("unknown property `{other}`"),
                    span: entry.span(),
                    label: "unknown".into(),
                    help: Some(
                        "properties: suite, scenario, trajectory, agent, repetition, \
                         turn_index, criterion, score, label"
                            .into(),
                    ),
                }),
            }
        }
        if !node_problems.is_empty() {
            problems.extend(node_problems);
            continue;
        }
        match finish(raw, line_of(node.span().offset())) {
            Ok(l) => labels.push(l),
            Err(message) => problems.push(BadNode {
                message,
                span: node.span(),
                label: "this label".into(),
                help: Some(
                    "a label needs scenario, trajectory and criterion, and score (0–1) and/or \
                     label"
                        .into(),
                ),
            }),
        }
    }
    if problems.is_empty() {
        Ok(labels)
    } else {
        Err(LabelsError::BadKdl {
            path: path.to_path_buf(),
            src: source(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn csv_rows_with_optional_columns_and_quoted_criteria() {
        let (_dir, path) = write(
            "labels.csv",
            "scenario,trajectory,repetition,criterion,score,label,note\n\
             booking,accepts,0,\"judge \"\"is polite\"\"\",0.9,pass,fine\n\
             \n\
             booking,declines,,judge x,,fail,\n",
        );
        let labels = read_labels(&path).unwrap();
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[0].criterion, "judge \"is polite\"");
        assert_eq!(labels[0].repetition, Some(0));
        assert_eq!(labels[0].score, Some(0.9));
        assert_eq!(labels[0].line, 2);
        assert_eq!(labels[1].repetition, None);
        assert_eq!(labels[1].label.as_deref(), Some("fail"));
        assert_eq!(labels[1].line, 4);
    }

    #[test]
    fn bad_csv_rows_are_all_reported_with_their_lines() {
        let (_dir, path) = write(
            "labels.csv",
            "scenario,trajectory,criterion,score\n\
             a,b,c,1.5\n\
             a,,c,0.5\n\
             a,b,c,\n\
             a,b,c,0.5\n",
        );
        let e = read_labels(&path).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("3 bad rows"), "{text}");
        assert!(
            text.contains("line 2: score 1.5 is not between 0 and 1"),
            "{text}"
        );
        assert!(text.contains("line 3: missing trajectory"), "{text}");
        assert!(
            text.contains("line 4: neither a score nor a label"),
            "{text}"
        );
        let (_dir, path) = write("l.csv", "scenario,criterion,score\n");
        let text = read_labels(&path).unwrap_err().to_string();
        assert!(
            text.contains("the header has no trajectory column"),
            "{text}"
        );
    }

    /// Lines counted from where the line ends are, as counting every `\n` before the row
    /// counts them, blank lines and `\r\n` included.
    #[test]
    fn a_long_csvs_bad_rows_have_the_lines_counted_from_its_start() {
        let mut text = String::from("scenario,trajectory,criterion,score\r\n");
        let mut expected = Vec::new();
        for i in 0..5_000 {
            if i % 7 == 0 {
                text.push_str("\r\n\n");
            }
            let bad = i % 1_000 == 999;
            if bad {
                let before = text.matches('\n').count();
                expected.push(format!(
                    "line {}: score 2 is not between 0 and 1",
                    before + 1
                ));
            }
            text.push_str(&format!("s{i},t,c,{}\r\n", if bad { "2" } else { "0.5" }));
        }
        let (_dir, path) = write("labels.csv", &text);
        let said = read_labels(&path).unwrap_err().to_string();
        assert!(said.contains("5 bad rows"), "{said}");
        for line in &expected {
            assert!(said.contains(line.as_str()), "{line} in {said}");
        }
    }

    #[test]
    fn jsonl_rows_and_their_errors() {
        let (_dir, path) = write(
            "labels.jsonl",
            "{\"scenario\":\"s\",\"trajectory\":\"t\",\"criterion\":\"c\",\"score\":1,\"turn_index\":2}\n\
             \n\
             {\"scenario\":\"s\",\"trajectory\":\"t\",\"criterion\":\"c\",\"repetition\":-1,\"label\":\"pass\"}\n\
             [1]\n",
        );
        let text = read_labels(&path).unwrap_err().to_string();
        assert!(
            text.contains("line 3: repetition is not a whole number"),
            "{text}"
        );
        assert!(text.contains("line 4: not a JSON object"), "{text}");
        let (_dir, path) = write(
            "labels.ndjson",
            "{\"scenario\":\"s\",\"trajectory\":\"t\",\"criterion\":\"c\",\"score\":1,\"turn_index\":2}\n",
        );
        let labels = read_labels(&path).unwrap();
        assert_eq!(labels[0].turn_index, Some(2));
        assert_eq!(labels[0].score, Some(1.0));
    }

    #[test]
    fn kdl_labels_and_diagnostics_with_spans() {
        let (_dir, path) = write(
            "labels.kdl",
            "label scenario=s trajectory=t criterion=\"judge polite\" score=0.75 label=pass\n\
             label scenario=s trajectory=t criterion=c score=2\n\
             lable scenario=s\n\
             label scenario=s trajectory=t criterion=c colour=red score=0.1\n",
        );
        let e = read_labels(&path).unwrap_err();
        let LabelsError::BadKdl { problems, .. } = &e else {
            panic!("{e:?}")
        };
        let messages: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            messages,
            [
                "`score` must be a number from 0 to 1",
                "unknown node `lable`",
                "unknown property `colour`"
            ]
        );
        // Drawn at their lines, columns counted in characters.
        let drawn = format!(
            "{:?}",
            miette::Report::new(e).with_source_code("ignored: the error's own source wins")
        );
        for at in ["labels.kdl:2:43", "labels.kdl:3:1", "labels.kdl:4:43"] {
            assert!(drawn.contains(at), "{at} in {drawn}");
        }
        let (_dir, path) = write(
            "labels.kdl",
            "label scenario=s trajectory=t criterion=\"judge polite\" score=1 repetition=2\n\
             label scenario=\"booking\" trajectory=\"accepts\" criterion=#\"judge \"is polite\"\"# \
             score=0.8 label=\"pass\"\n",
        );
        let labels = read_labels(&path).unwrap();
        assert_eq!(labels[0].score, Some(1.0));
        assert_eq!(labels[0].repetition, Some(2));
        // The example of docs/results.md.
        assert_eq!(labels[1].criterion, "judge \"is polite\"");
        assert_eq!(labels[1].line, 2);
        let (_dir, path) = write("labels.kdl", "label scenario=\"unclosed\n");
        assert!(matches!(
            read_labels(&path),
            Err(LabelsError::KdlSyntax { .. })
        ));
        let (_dir, path) = write("labels.txt", "x");
        assert!(matches!(
            read_labels(&path),
            Err(LabelsError::UnknownFormat { .. })
        ));
    }
}
