//! `trellis calibrate`: the console side of `trellis_reports::calibration`. Exit codes: 0
//! no judge is below the agreement floor, 1 a judge is, 2 usage, a run that cannot be
//! found or has no judged checks, a bad labels file, or labels that measured no judge, 3 `calibration.json` could not be
//! written.

use std::path::PathBuf;

use clap::Args;
use comfy_table::Cell;
use trellis_reports::calibrate::Figure;
use trellis_reports::calibration::{self, Calibration, Floors, Trust};
use trellis_reports::history;

use super::console::{self, errln, outln};
use super::history::RunsDir;
use super::{EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_OK};

/// Unmatched labels and unlabelled checks listed on the console; all are in the JSON.
const LISTED: usize = 10;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The run: a run directory, a run id (or a unique prefix), a name, or `pinned`.
    #[arg(add = clap_complete::ArgValueCandidates::new(super::complete::runs))]
    run: String,
    /// Human labels: a *.csv, *.jsonl (*.ndjson) or *.kdl file (columns in docs/results.md).
    labels: PathBuf,
    /// A judge whose Cohen's kappa with the human labels is below this, on any rubric, is
    /// below the floor.
    #[arg(
        long,
        value_name = "KAPPA",
        default_value_t = 0.6,
        value_parser = coefficient,
        allow_negative_numbers = true
    )]
    min_kappa: f64,
    /// Also mark a judge whose Pearson correlation with the human scores is below this.
    #[arg(
        long,
        value_name = "R",
        value_parser = coefficient,
        allow_negative_numbers = true
    )]
    min_correlation: Option<f64>,
    #[command(flatten)]
    runs: RunsDir,
    /// Print calibration.json to stdout instead of tables.
    #[arg(long)]
    json: bool,
}

/// A number between −1 and 1.
fn coefficient(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (-1.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{text}` is not a number between -1 and 1")),
    }
}

pub fn calibrate(args: CalibrateArgs) -> u8 {
    let run = match history::resolve_run(&args.runs.dir, &args.run) {
        Ok(run) => run,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let labels = match trellis_reports::labels::read_labels(&args.labels) {
        Ok(labels) => labels,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let floors = Floors {
        min_kappa: args.min_kappa,
        min_correlation: args.min_correlation,
    };
    let result = match calibration::calibrate_run(&run.dir, &args.labels, &labels, floors) {
        Ok(c) => c,
        Err(e) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INVALID;
        }
    };
    let path = run.dir.join(calibration::CALIBRATION_FILE);
    // Nothing measured (labels written for another run, or a judge that answered none of
    // them): a pass here would let a wrong run id or labels file through a `--min-kappa`
    // gate, and a calibration.json of nothing would replace a real one.
    let measured = !result.judges.is_empty();
    let written = measured.then(|| trellis_reports::write_json(&path, &result));
    if args.json {
        match trellis_reports::to_json_string(&result) {
            Ok(text) => outln!("{text}"),
            Err(e) => errln!("error: cannot encode the calibration: {e}"),
        }
    } else {
        print(&result);
        if let Some(Ok(())) = &written {
            outln!("wrote {}", path.display());
        }
    }
    match written {
        None => {
            errln!(
                "error: no judge was measured: {} of {} matched a judged check of run {} that \
                 its judge answered; {} was not written\n  help: labels name the scenario, \
                 trajectory and check of the run they were written for (docs/results.md, \
                 \"Calibrating judges\")",
                result.matched,
                console::count(result.labels as u64, "label", "labels"),
                result.run_id,
                calibration::CALIBRATION_FILE,
            );
            return EXIT_INVALID;
        }
        Some(Err(e)) => {
            errln!("{:?}", miette::Report::new(e));
            return EXIT_INCOMPLETE;
        }
        Some(Ok(())) => {}
    }
    if result.below_floor.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}

fn figure(f: &Figure) -> String {
    match (f.value, f.ci95) {
        (Some(v), Some([low, high])) => format!("{v:.2} [{low:.2}, {high:.2}]"),
        (Some(v), None) => format!("{v:.2}"),
        (None, _) => "n/a".to_owned(),
    }
}

fn print(c: &Calibration) {
    let mut table = console::table(&[
        "judge",
        "rubric",
        "n",
        "kappa [95% CI]",
        "agree",
        "Pearson",
        "Spearman",
        "MAE",
        "trust",
    ]);
    for j in &c.judges {
        let trust = match j.trust {
            Trust::Trusted => console::verdict_cell("trusted", false, true),
            Trust::BelowFloor => console::verdict_cell("BELOW FLOOR", true, false),
            Trust::NotEstablished => Cell::new("not established"),
        };
        table.add_row(vec![
            Cell::new(&j.judge),
            Cell::new(&j.rubric),
            Cell::new(format!("{} ({} scored)", j.n, j.scored)),
            Cell::new(figure(&j.kappa)),
            Cell::new(
                j.agreement
                    .value
                    .map_or("n/a".into(), |v| format!("{:.0}%", v * 100.0)),
            ),
            Cell::new(figure(&j.pearson)),
            Cell::new(figure(&j.spearman)),
            Cell::new(figure(&j.mae)),
            trust,
        ]);
    }
    outln!("calibration of run {} against {}", c.run_id, c.labels_file);
    if c.judges.is_empty() {
        outln!("no label matched a judged check the judge answered");
    } else {
        outln!("{table}");
    }
    for j in c.judges.iter().filter(|j| !j.reasons.is_empty()) {
        outln!("  {} / {}: {}", j.judge, j.rubric, j.reasons.join("; "));
    }
    outln!(
        "{}: {} matched, {} not used; {}: {} without a label, {} their judge did not answer",
        console::count(c.labels as u64, "label", "labels"),
        c.matched,
        c.unmatched_labels.len(),
        console::count(c.judged_checks as u64, "judged check", "judged checks"),
        c.unlabeled_checks.len(),
        c.judge_errors.len()
    );
    for u in c.unmatched_labels.iter().take(LISTED) {
        outln!(
            "  label on line {} ({}/{} `{}`): {}",
            u.line,
            u.scenario,
            u.trajectory,
            u.criterion,
            u.why
        );
    }
    for k in c.unlabeled_checks.iter().take(LISTED) {
        let turn = k
            .turn_index
            .map(|t| format!(" turn {t}"))
            .unwrap_or_default();
        outln!(
            "  no label: {}/{} {} [{}] repetition {}{turn} `{}`",
            k.suite,
            k.scenario,
            k.trajectory,
            k.agent,
            k.repetition,
            k.criterion
        );
    }
    for k in c.judge_errors.iter().take(LISTED) {
        outln!(
            "  {}: {}/{} {} `{}`: {}",
            if k.status == "skipped" {
                "not judged"
            } else {
                "judge failed"
            },
            k.suite,
            k.scenario,
            k.trajectory,
            k.criterion,
            k.detail.as_deref().unwrap_or("")
        );
    }
    let listed = |n: usize| n > LISTED;
    if listed(c.unmatched_labels.len())
        || listed(c.unlabeled_checks.len())
        || listed(c.judge_errors.len())
    {
        outln!("  (the first {LISTED} of each; calibration.json lists them all)");
    }
    if c.judges.is_empty() {
        // Nothing measured: the caller says so.
    } else if c.below_floor.is_empty() {
        outln!(
            "{}: no judge is below the agreement floor (kappa {}{})",
            console::paint_pass("OK"),
            c.floors.min_kappa,
            c.floors
                .min_correlation
                .map(|r| format!(", Pearson r {r}"))
                .unwrap_or_default()
        );
    } else {
        outln!(
            "{}: {} (compare and run --baseline will not gate on their mean score)",
            console::paint_fail("BELOW FLOOR"),
            c.below_floor.join(", ")
        );
    }
}
