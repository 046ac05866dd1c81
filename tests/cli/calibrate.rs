//! `trellis calibrate` on synthetic run directories: runs written through the real report
//! writer, their `criteria.parquet` then replaced by one with judge columns (as judged runs
//! write it), and human labels files. Exit codes, `calibration.json`, a judge below the
//! floor, and `compare` refusing to gate on that run's mean judge score.

use std::path::Path;

use polars_core::prelude::*;
use polars_io::prelude::*;

use super::history::{compare, sample, write_run};
use super::*;

/// One judged check: (trajectory, judge, criterion, status, score, label).
type Judged = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    f64,
    &'static str,
);

const POLITE: &str = "judge \"is polite\"";
const HELPFUL: &str = "judge \"is helpful\"";

/// The checks of the synthetic judged run: judge `good` agrees with the labels below,
/// judge `sloppy` agrees on half (kappa 0).
fn judged_checks() -> Vec<Judged> {
    vec![
        ("t1", "good", POLITE, "passed", 0.9, "pass"),
        ("t2", "good", POLITE, "failed", 0.2, "fail"),
        ("t3", "good", POLITE, "passed", 0.8, "pass"),
        ("t4", "good", POLITE, "failed", 0.1, "fail"),
        ("t5", "good", POLITE, "error", f64::NAN, ""),
        ("t6", "good", POLITE, "passed", 0.7, "pass"),
        ("t1", "sloppy", HELPFUL, "passed", 0.8, "pass"),
        ("t2", "sloppy", HELPFUL, "passed", 0.7, "pass"),
        ("t3", "sloppy", HELPFUL, "failed", 0.3, "fail"),
        ("t4", "sloppy", HELPFUL, "failed", 0.2, "fail"),
    ]
}

/// Replaces `dir/criteria.parquet` with judged checks plus one plain `reply` check.
fn write_judged_criteria(dir: &Path, run_id: &str) {
    write_criteria(dir, run_id, &judged_checks());
}

/// Replaces `dir/criteria.parquet` with `checks` plus one plain `reply` check.
fn write_criteria(dir: &Path, run_id: &str, checks: &[Judged]) {
    let n = checks.len() + 1;
    let text =
        |f: &dyn Fn(&Judged) -> Option<String>, plain: Option<&str>| -> Vec<Option<String>> {
            checks
                .iter()
                .map(f)
                .chain(std::iter::once(plain.map(str::to_owned)))
                .collect()
        };
    let judge = |c: &Judged| Some(c.1.to_owned());
    let mut df = DataFrame::new(
        n,
        vec![
            Column::new("run_id".into(), vec![run_id.to_owned(); n]),
            Column::new("schema_version".into(), vec![2u32; n]),
            Column::new("suite".into(), vec!["s".to_owned(); n]),
            Column::new("scenario".into(), vec!["c".to_owned(); n]),
            Column::new(
                "trajectory".into(),
                text(&|c| Some(c.0.to_owned()), Some("t1")),
            ),
            Column::new("agent".into(), vec!["a".to_owned(); n]),
            Column::new("repetition".into(), vec![0u32; n]),
            Column::new("turn_index".into(), vec![Some(0u32); n]),
            Column::new(
                "criterion".into(),
                text(&|c| Some(c.2.to_owned()), Some("reply contains=\"hi\"")),
            ),
            Column::new(
                "kind".into(),
                text(&|_| Some("judge".to_owned()), Some("reply")),
            ),
            Column::new(
                "status".into(),
                text(&|c| Some(c.3.to_owned()), Some("passed")),
            ),
            Column::new(
                "passed".into(),
                checks
                    .iter()
                    .map(|c| c.3 == "passed")
                    .chain([true])
                    .collect::<Vec<bool>>(),
            ),
            Column::new(
                "detail".into(),
                text(
                    &|c| (c.3 == "error").then(|| "the judge answered garbage".to_owned()),
                    None,
                ),
            ),
            Column::new("judge".into(), text(&judge, None)),
            Column::new(
                "judge_provider".into(),
                text(&|_| Some("fake".to_owned()), None),
            ),
            Column::new(
                "judge_model".into(),
                text(&|_| Some("m-1".to_owned()), None),
            ),
            Column::new("rubric".into(), text(&|_| Some("generic".to_owned()), None)),
            Column::new(
                "score".into(),
                checks
                    .iter()
                    .map(|c| (!c.4.is_nan()).then_some(c.4))
                    .chain([None])
                    .collect::<Vec<Option<f64>>>(),
            ),
            Column::new(
                "threshold".into(),
                checks
                    .iter()
                    .map(|_| Some(0.5))
                    .chain([None])
                    .collect::<Vec<Option<f64>>>(),
            ),
            Column::new(
                "label".into(),
                text(&|c| (!c.5.is_empty()).then(|| c.5.to_owned()), None),
            ),
            Column::new(
                "justification".into(),
                text(&|_| Some("because".to_owned()), None),
            ),
        ],
    )
    .unwrap();
    let file = std::fs::File::create(dir.join("criteria.parquet")).unwrap();
    ParquetWriter::new(file).finish(&mut df).unwrap();
}

/// Sets `stats.aggregates.mean_score` in `dir/summary.json`, as a judged run records it.
fn set_mean_score(dir: &Path, score: f64) {
    let path = dir.join("summary.json");
    let mut summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    summary["stats"]["aggregates"]["mean_score"] = score.into();
    std::fs::write(&path, summary.to_string()).unwrap();
}

/// Labels for the judged checks: the human agrees with `good` throughout and with `sloppy`
/// on t2 and t4; one label names no check, one a check whose judge failed.
const LABELS_CSV: &str = "\
scenario,trajectory,repetition,criterion,score,label,note
c,t1,0,\"judge \"\"is polite\"\"\",1.0,pass,
c,t2,0,\"judge \"\"is polite\"\"\",0.0,fail,
c,t3,0,\"judge \"\"is polite\"\"\",0.7,,scored only
c,t4,0,\"judge \"\"is polite\"\"\",0.3,fail,
c,t5,0,\"judge \"\"is polite\"\"\",0.5,pass,the judge failed here
c,t1,0,\"judge \"\"is helpful\"\"\",0.1,fail,
c,t2,0,\"judge \"\"is helpful\"\"\",0.9,pass,
c,t3,0,\"judge \"\"is helpful\"\"\",0.8,pass,
c,t4,0,\"judge \"\"is helpful\"\"\",0.2,fail,
c,t9,0,\"judge \"\"is polite\"\"\",0.2,fail,no such trajectory
";

async fn calibrate(runs: &Path, args: &[&str]) -> Output {
    trellis()
        .arg("calibrate")
        .args(args)
        .arg("--dir")
        .arg(runs)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn calibrate_marks_a_judge_below_the_floor_and_compare_will_not_gate_on_it() {
    let runs = tempfile::tempdir().unwrap();
    let samples = [sample("t1", 0, true, 100.0), sample("t2", 0, true, 100.0)];
    write_run(runs.path(), "base", "2026-01-01T00:00:00Z", &samples);
    write_run(runs.path(), "head", "2026-01-02T00:00:00Z", &samples);
    let labels = runs.path().join("labels.csv");
    std::fs::write(&labels, LABELS_CSV).unwrap();
    let labels = labels.to_str().unwrap();

    // A run without judge columns says so.
    let o = calibrate(runs.path(), &["head", labels]).await;
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("this run has no judged checks"),
        "{}",
        stderr(&o)
    );

    let head = runs.path().join("head");
    write_judged_criteria(&head, "20260102T000000Z-head");
    set_mean_score(&runs.path().join("base"), 90.0);
    set_mean_score(&head, 70.0);

    // Uncalibrated, a 20-point drop of the mean judge score regresses.
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("run mean_score"), "{}", stdout(&o));

    // Bad labels files exit 2 and say where.
    let bad = runs.path().join("bad.csv");
    std::fs::write(
        &bad,
        "scenario,trajectory,criterion,score\nc,t1,x,1.5\nc,t1,x,\n",
    )
    .unwrap();
    let o = calibrate(runs.path(), &["head", bad.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("line 2: score 1.5 is not between 0 and 1"),
        "{err}"
    );
    assert!(err.contains("line 3: neither a score nor a label"), "{err}");
    let bad = runs.path().join("bad.kdl");
    std::fs::write(
        &bad,
        "label scenario=c trajectory=t1 criterion=x colour=red\n",
    )
    .unwrap();
    let o = calibrate(runs.path(), &["head", bad.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown property `colour`"),
        "{}",
        stderr(&o)
    );
    assert!(!head.join("calibration.json").exists());

    // The labels: `sloppy` is below the floor, exit 1.
    let o = calibrate(runs.path(), &["head", labels]).await;
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains("BELOW FLOOR: sloppy"), "{out}");
    assert!(out.contains("10 labels: 9 matched, 1 not used"), "{out}");
    assert!(out.contains("label on line 11"), "{out}");
    assert!(out.contains("no label: s/c t6 [a]"), "{out}");
    assert!(out.contains("judge failed: s/c t5"), "{out}");
    let calibration: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(head.join("calibration.json")).unwrap())
            .unwrap();
    assert_eq!(calibration["below_floor"], serde_json::json!(["sloppy"]));
    let judges = calibration["judges"].as_array().unwrap();
    let good = &judges[0];
    assert_eq!(good["judge"], "good");
    assert_eq!(good["n"], 4);
    assert_eq!(good["kappa"]["value"], 1.0);
    assert_eq!(good["trust"], "trusted");
    let sloppy = &judges[1];
    assert_eq!(sloppy["kappa"]["value"], 0.0);
    assert_eq!(sloppy["trust"], "below_floor");
    assert_eq!(sloppy["agreement"]["value"], 0.5);
    assert_eq!(calibration["unmatched_labels"][0]["line"], 11);
    assert_eq!(calibration["unlabeled_checks"][0]["trajectory"], "t6");
    assert_eq!(calibration["judge_errors"][0]["trajectory"], "t5");

    // compare now shows the score but does not gate on it.
    let o = compare(runs.path(), &["base", "head"]).await;
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("the mean judge score does not gate"), "{out}");
    assert!(out.contains("`sloppy` in run"), "{out}");
    let o = compare(runs.path(), &["base", "head", "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let score = json["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "mean_score")
        .unwrap();
    assert_eq!(score["verdict"], "ungated");
    assert_eq!(json["untrusted_judges"][0]["judge"], "sloppy");
    assert!(json["score_gate_refused"].is_string());
    // … unless told to.
    let o = compare(runs.path(), &["base", "head", "--gate-untrusted-judges"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("gates anyway"), "{}", stdout(&o));

    // A lower floor trusts both: exit 0, and compare gates again. A negative floor is taken
    // as the flag's value, written either way (`-0.5` alone was read as another flag).
    let o = calibrate(
        runs.path(),
        &["head", labels, "--min-kappa", "-0.5", "--json"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = calibrate(runs.path(), &["head", labels, "--min-kappa=-0.5", "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["below_floor"], serde_json::json!([]));
    let o = compare(runs.path(), &["base", "head"]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));

    // A correlation floor: `sloppy`'s scores run against the human's.
    let o = calibrate(
        runs.path(),
        &["head", labels, "--min-kappa=-1", "--min-correlation", "0.5"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("Pearson r"), "{}", stdout(&o));

    // Labels written for another run measure no judge: exit 2, no "OK", and the run's
    // calibration is kept.
    let before = std::fs::read_to_string(head.join("calibration.json")).unwrap();
    let other = runs.path().join("other.csv");
    std::fs::write(
        &other,
        "scenario,trajectory,criterion,score\nelsewhere,t1,\"judge \"\"is polite\"\"\",1\n",
    )
    .unwrap();
    let o = calibrate(runs.path(), &["head", other.to_str().unwrap()]).await;
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(!out.contains("OK"), "{out}");
    assert!(out.contains("1 label: 0 matched, 1 not used"), "{out}");
    assert!(
        err.contains("no judge was measured: 0 of 1 label matched a judged check"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(head.join("calibration.json")).unwrap(),
        before
    );

    // Usage errors exit 2.
    let o = calibrate(runs.path(), &["head", labels, "--min-kappa", "2"]).await;
    assert_eq!(o.status.code(), Some(2));
    let o = calibrate(runs.path(), &["nope", labels]).await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test]
async fn run_with_a_calibrated_baseline_will_not_gate_on_its_untrusted_judge() {
    let runs = tempfile::tempdir().unwrap();
    let base = runs.path().join("base");
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--out"])
        .arg(&base)
        .output()
        .await
        .unwrap();
    // asks-price fails on purpose in every run.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("run.json")).unwrap()).unwrap();
    write_judged_criteria(&base, meta["run_id"].as_str().unwrap());
    let labels = runs.path().join("labels.csv");
    std::fs::write(&labels, LABELS_CSV).unwrap();
    let o = calibrate(runs.path(), &["base", labels.to_str().unwrap()]).await;
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));

    let head = runs.path().join("head");
    // A calibration left in the output directory belongs to the run --replace replaces.
    std::fs::create_dir_all(&head).unwrap();
    let o = trellis()
        .args(["run", "suites/booking.kdl", "-q", "--out"])
        .arg(&head)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    std::fs::copy(base.join("calibration.json"), head.join("calibration.json")).unwrap();
    let o = trellis()
        .args([
            "run",
            "suites/booking.kdl",
            "--baseline",
            "base",
            "--max-latency-increase",
            "100000",
            "--replace",
            "--out",
        ])
        .arg(&head)
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("the mean judge score does not gate"), "{out}");
    assert!(!head.join("calibration.json").exists());
    let comparison: trellis_reports::compare::Comparison =
        serde_json::from_str(&std::fs::read_to_string(head.join("compare.json")).unwrap()).unwrap();
    assert_eq!(comparison.untrusted_judges.len(), 1);
    assert_eq!(comparison.untrusted_judges[0].judge, "sloppy");
    assert!(comparison.score_gate_refused.is_some());
}

#[tokio::test]
async fn pass_and_fail_labels_are_compared_with_the_verdict_of_an_outcome_judge() {
    let runs = tempfile::tempdir().unwrap();
    let samples = [sample("t1", 0, true, 100.0)];
    write_run(runs.path(), "run", "2026-01-01T00:00:00Z", &samples);
    // Outcome checks judged `holds`/`does not hold`, as outcome judges label them.
    const OUTCOME: &str = "outcome \"the booking is made\"";
    let trajectories = ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"];
    let checks: Vec<Judged> = trajectories
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if i % 2 == 0 {
                (*t, "judge", OUTCOME, "passed", 0.9, "holds")
            } else {
                (*t, "judge", OUTCOME, "failed", 0.1, "does not hold")
            }
        })
        .collect();
    write_criteria(&runs.path().join("run"), "20260101T000000Z-run", &checks);
    let write_labels = |name: &str, label_of: &dyn Fn(usize) -> &'static str| {
        let mut csv = String::from("scenario,trajectory,criterion,label\n");
        for (i, t) in trajectories.iter().enumerate() {
            csv.push_str(&format!(
                "c,{t},\"outcome \"\"the booking is made\"\"\",{}\n",
                label_of(i)
            ));
        }
        let path = runs.path().join(name);
        std::fs::write(&path, csv).unwrap();
        path.to_str().unwrap().to_owned()
    };
    // pass/fail, agreeing with the verdict on 7 of 8.
    let labels = write_labels("pass-fail.csv", &|i| {
        if (i % 2 == 0) != (i == 3) {
            "pass"
        } else {
            "fail"
        }
    });
    let o = calibrate(runs.path(), &["run", &labels]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let c: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(runs.path().join("run/calibration.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(c["judges"][0]["agreement"]["value"], 0.875, "{c}");
    assert!(c["below_floor"].as_array().unwrap().is_empty(), "{c}");

    // A vocabulary that shares nothing with the judge's is an error naming both.
    let labels = write_labels("yes-no.csv", &|i| if i % 2 == 0 { "yes" } else { "no" });
    let o = calibrate(runs.path(), &["run", &labels]).await;
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("`no`, `yes`"), "{err}");
    assert!(err.contains("`does not hold`, `holds`"), "{err}");
}
