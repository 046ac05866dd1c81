//! `junit.xml`: one test suite per Trellis suite, one test case per trajectory, for CI
//! systems that display JUnit results.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use trellis_engine::record::{CriterionStatus, RunInfo, TrajectoryRecord, TrajectoryStatus};

use crate::error::ReportError;

/// Collects test cases as trajectories stream by; suites keep the run's load order.
pub(crate) struct JunitBuilder {
    run_id: String,
    suites: Vec<TestSuite>,
}

fn millis(ms: f64) -> Duration {
    // The journal is data: a negative or non-finite duration must not panic.
    Duration::try_from_secs_f64(ms / 1000.0).unwrap_or_default()
}

/// `scenario/trajectory [agent #rep]`.
pub(crate) fn case_name(t: &TrajectoryRecord) -> String {
    format!(
        "{}/{} [{} #{}]",
        t.scenario, t.trajectory, t.agent, t.repetition
    )
}

impl JunitBuilder {
    pub(crate) fn new(info: &RunInfo) -> Self {
        JunitBuilder {
            run_id: info.run_id.clone(),
            suites: info.suites.iter().map(TestSuite::new).collect(),
        }
    }

    pub(crate) fn add(&mut self, t: &TrajectoryRecord) {
        let status = match t.status {
            TrajectoryStatus::Passed => TestCaseStatus::success(),
            TrajectoryStatus::Failed => {
                let failed: Vec<_> = t
                    .criteria
                    .iter()
                    .filter(|c| c.status == CriterionStatus::Failed)
                    .collect();
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let message = match failed.as_slice() {
                    [] => "trajectory failed".to_owned(),
                    [one] => format!("criterion failed: {}", one.criterion),
                    many => format!("{} criteria failed", many.len()),
                };
                let mut description = String::new();
                for c in &failed {
                    let turn = c
                        .turn_index
                        .map(|i| format!(" (turn {i})"))
                        .unwrap_or_default();
                    description.push_str(&format!(
                        "{} [{}]{}: {}\n",
                        c.criterion,
                        c.kind,
                        turn,
                        c.detail.as_deref().unwrap_or("failed")
                    ));
                }
                if let Some(fault) = &t.fault {
                    description.push_str(&format!(
                        "fault {}: {}\n",
                        fault.category.as_str(),
                        fault.message
                    ));
                }
                status.set_message(message).set_type("criteria");
                if !description.is_empty() {
                    status.set_description(description);
                }
                status
            }
            TrajectoryStatus::Error => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                match &t.fault {
                    Some(fault) => {
                        status
                            .set_message(fault.message.as_str())
                            .set_type(fault.category.as_str());
                    }
                    None => {
                        status.set_message("trajectory errored");
                    }
                }
                status
            }
            TrajectoryStatus::Skipped => {
                let mut status = TestCaseStatus::skipped();
                if let Some(reason) = &t.skip_reason {
                    status.set_message(reason.as_str());
                }
                status
            }
        };
        let mut case = TestCase::new(case_name(t), status);
        case.set_classname(format!("{}.{}", t.suite, t.scenario))
            .set_time(millis(t.duration_ms))
            .set_assertions(t.criteria.len());
        match self.suites.iter_mut().find(|s| s.name.as_str() == t.suite) {
            Some(suite) => {
                suite.add_test_case(case);
            }
            None => {
                let mut suite = TestSuite::new(t.suite.as_str());
                suite.add_test_case(case);
                self.suites.push(suite);
            }
        }
    }

    pub(crate) fn write(self, path: &Path) -> Result<(), ReportError> {
        let mut report = Report::new(format!("trellis {}", self.run_id));
        report.add_test_suites(self.suites);
        let file = File::create(path).map_err(|e| ReportError::io("create", path, e))?;
        let mut out = BufWriter::new(file);
        report
            .serialize(&mut out)
            .map_err(|source| ReportError::Junit {
                path: path.to_path_buf(),
                source,
            })?;
        out.flush().map_err(|e| ReportError::io("write", path, e))
    }
}
