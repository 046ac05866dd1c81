//! Where a failed check is written: the file, line and column the console prints beside each
//! failure it lists, for a terminal or an editor to jump to.
//!
//! Made from the plan and the suite files before the run lets the project go. It keeps the
//! files' text (what the suites weigh, not their datasets) and one scenario model per
//! scenario as written (the first instance of a `for-each` or `matrix`), and is read only
//! when a failure is printed: a run that passes pays a handle per scenario and nothing more.

use std::sync::Arc;

use trellis_dsl::{Scenario, SourceFile, Span};
use trellis_engine::plan::Plan;
use trellis_engine::record::{CriterionRecord, TrajectoryRecord};

pub struct Sites {
    files: Vec<SourceFile>,
    /// (suite, scenario id as written, its model), in plan order.
    scenarios: Vec<(Arc<str>, Arc<Scenario>)>,
}

impl Sites {
    pub fn of(plan: &Plan, project: &trellis_dsl::Project) -> Sites {
        let planned = plan
            .scenarios
            .iter()
            .map(|s| (Arc::clone(&s.suite), Arc::clone(&s.scenario)));
        Sites::of_scenarios(project.files.clone(), planned)
    }

    /// Every scenario of `project`, for results recorded elsewhere (`trellis merge`).
    pub fn of_project(project: &trellis_dsl::Project) -> Sites {
        let all = project.suites.iter().flat_map(|suite| {
            let name: Arc<str> = Arc::from(suite.name.as_str());
            suite
                .scenarios
                .iter()
                .map(move |sc| (Arc::clone(&name), Arc::clone(sc)))
        });
        // Loaded from the absolute paths the shards recorded: named from the working
        // directory, as the paths a run is given are.
        let cwd = std::env::current_dir().ok();
        let files = project
            .files
            .iter()
            .cloned()
            .map(|mut file| {
                if let Some(relative) = cwd.as_deref().and_then(|c| file.path.strip_prefix(c).ok())
                {
                    file.name = relative.to_string_lossy().replace('\\', "/");
                }
                file
            })
            .collect();
        Sites::of_scenarios(files, all)
    }

    fn of_scenarios(
        files: Vec<SourceFile>,
        all: impl Iterator<Item = (Arc<str>, Arc<Scenario>)>,
    ) -> Sites {
        let mut scenarios: Vec<(Arc<str>, Arc<Scenario>)> = Vec::new();
        for (suite, scenario) in all {
            // The instances of one scenario come one after the other and are written at the
            // same place: the first stands for the rest.
            let same_as_last = scenarios
                .last()
                .is_some_and(|(s, last)| *s == suite && written_id(last) == written_id(&scenario));
            if !same_as_last {
                scenarios.push((suite, scenario));
            }
        }
        Sites { files, scenarios }
    }

    /// `file:line:column` of each place a result's check (its `criterion` text, on `turn`
    /// of `trajectory`, `None` for the trajectory's own criteria) may be written; `scenario`
    /// is the result's (an instance's id, `refund[x=1]`, finds the scenario as written).
    /// Empty when it cannot be told.
    pub fn of_check(
        &self,
        suite: &str,
        scenario: &str,
        trajectory: &str,
        turn: Option<u32>,
        criterion: &str,
    ) -> Vec<String> {
        let find = |id: &str| {
            self.scenarios
                .iter()
                .find(|(s, m)| &**s == suite && written_id(m) == id)
        };
        let instance_of = || {
            scenario
                .strip_suffix(']')
                .and_then(|s| s.split_once('['))
                .and_then(|(base, _)| find(base))
        };
        let Some((_, model)) = find(scenario).or_else(instance_of) else {
            return Vec::new();
        };
        let mut sites: Vec<String> = Vec::new();
        for c in model.checks_written_as(trajectory, turn, criterion) {
            if let Some(site) = self.site(c.span)
                && !sites.contains(&site)
            {
                sites.push(site);
            }
        }
        sites
    }

    /// `  (suites/a.kdl:12:9)`, to follow a failed check `c` of `t`; empty when its place
    /// is not known.
    pub fn after_check(&self, t: &TrajectoryRecord, c: &CriterionRecord) -> String {
        let found = self.of_check(
            &t.suite,
            &t.scenario,
            &t.trajectory,
            c.turn_index,
            &c.criterion,
        );
        if found.is_empty() {
            String::new()
        } else {
            format!("  ({})", found.join(", "))
        }
    }

    fn site(&self, span: Span) -> Option<String> {
        let file = self.files.get(span.file)?;
        let offset = span.span.offset();
        let (line, range) = file.line_at(offset);
        let column = file.chars_between(range.start, offset.clamp(range.start, range.end)) + 1;
        Some(format!("{}:{}:{column}", file.name, line + 1))
    }
}

fn written_id(scenario: &Scenario) -> &str {
    scenario
        .instance
        .as_ref()
        .map_or(scenario.id.value.as_str(), |i| i.base.as_str())
}
