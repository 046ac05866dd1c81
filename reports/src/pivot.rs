//! The matrix pivot: pass rates of a `matrix` scenario by one variable's values, so the
//! console and the report can set `tone=polite` beside `tone=angry` (or one model beside
//! another) whatever rows and other variables the instances also vary over.
//!
//! One grid per suite and matrix variable: rows are the scenarios as written (and the agent,
//! when a scenario ran against several), columns the variable's values in the order first
//! seen, each cell the trajectories of every instance with that value together.

use std::collections::BTreeMap;

use trellis_records::ScenarioInfo;

/// One suite's instances by one matrix variable.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixGrid {
    pub suite: String,
    /// The variable (`tone`).
    pub var: String,
    /// Its values as instance ids show them (text without quotes, others as JSON).
    pub values: Vec<String>,
    pub rows: Vec<MatrixRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MatrixRow {
    /// The scenario's id as written (`refund` for `refund[A17,tone=polite]`).
    pub scenario: String,
    /// The agent, when the scenario ran against several (one row each).
    pub agent: Option<String>,
    /// Per value: trajectories passed and trajectories that ran (passed, failed or
    /// errored); `None` where no instance with the value ran.
    pub cells: Vec<Option<(u64, u64)>>,
}

/// An instance: its scenario as written and its values (name, shown), in the order written.
type Instance<'a> = (&'a str, Vec<(&'a str, String)>);
/// A cell's key: suite, variable, scenario as written, agent, value.
type CellKey<'a> = (&'a str, &'a str, &'a str, &'a str, String);

/// The grids of a run: `scenarios` from its `run_started`, `counts` one item per suite,
/// scenario (instance id) and agent with its trajectories passed and ran. Suites come in
/// the order of `suites`, variables in the order written.
pub fn matrix_grids<'a>(
    suites: &[String],
    scenarios: &'a [ScenarioInfo],
    counts: impl IntoIterator<Item = (&'a str, &'a str, &'a str, u64, u64)>,
) -> Vec<MatrixGrid> {
    // (suite, instance id) → (scenario as written, its values shown).
    let mut instances: BTreeMap<(&str, &str), Instance> = BTreeMap::new();
    for s in scenarios {
        let Some(i) = &s.instance else { continue };
        if i.vars.is_empty() {
            continue;
        }
        let mut vars: Vec<(&str, String)> = i
            .vars
            .iter()
            .map(|(name, v)| {
                let shown = match v {
                    serde_json::Value::String(t) => t.clone(),
                    other => other.to_string(),
                };
                (name.as_str(), shown)
            })
            .collect();
        // The stored values are keyed by name; the instance id has them in the order
        // written (`refund[A17,tone=polite,n=1]`).
        vars.sort_by_key(|(name, _)| {
            s.scenario
                .find(&format!(",{name}="))
                .or_else(|| s.scenario.find(&format!("[{name}=")))
                .unwrap_or(usize::MAX)
        });
        instances.insert(
            (s.suite.as_str(), s.scenario.as_str()),
            (i.of.as_str(), vars),
        );
    }
    if instances.is_empty() {
        return Vec::new();
    }
    // (suite, var) → values in plan order (as written: the first variable varies slowest),
    // and (suite, var, scenario, agent, value) → counts.
    let mut values: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    let mut order: Vec<(&str, &str)> = Vec::new();
    for s in scenarios {
        let Some((_, vars)) = instances.get(&(s.suite.as_str(), s.scenario.as_str())) else {
            continue;
        };
        for (var, value) in vars {
            let known = values.entry((s.suite.as_str(), var)).or_insert_with(|| {
                order.push((s.suite.as_str(), var));
                Vec::new()
            });
            if !known.contains(value) {
                known.push(value.clone());
            }
        }
    }
    let mut cells: BTreeMap<CellKey, (u64, u64)> = BTreeMap::new();
    let mut agents: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for (suite, scenario, agent, passed, ran) in counts {
        let Some(((suite, _), (base, vars))) = instances.get_key_value(&(suite, scenario)) else {
            continue;
        };
        let list = agents.entry((suite, base)).or_default();
        if !list.contains(&agent) {
            list.push(agent);
        }
        for (var, value) in vars {
            let cell = cells
                .entry((suite, var, base, agent, value.clone()))
                .or_default();
            cell.0 += passed;
            cell.1 += ran;
        }
    }
    // Variables in the order the instances name them, suites in load order.
    order.sort_by_key(|(suite, _)| suites.iter().position(|s| s == suite));
    let mut grids = Vec::new();
    for (suite, var) in order {
        let vals = values.get(&(suite, var)).cloned().unwrap_or_default();
        let mut rows: Vec<MatrixRow> = Vec::new();
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (s, v, base, agent, _) in cells.keys() {
            if *s != suite || *v != var || seen.contains(&(base, agent)) {
                continue;
            }
            seen.push((base, agent));
            let several = agents.get(&(suite, base)).is_some_and(|a| a.len() > 1);
            rows.push(MatrixRow {
                scenario: base.to_string(),
                agent: several.then(|| agent.to_string()),
                cells: vals
                    .iter()
                    .map(|value| {
                        cells
                            .get(&(suite, var, base, agent, value.clone()))
                            .copied()
                    })
                    .collect(),
            });
        }
        grids.push(MatrixGrid {
            suite: suite.to_string(),
            var: var.to_string(),
            values: vals,
            rows,
        });
    }
    grids
}

/// A cell as the console and the report show it: the pass rate and its 95% interval.
pub fn cell_text((passed, ran): (u64, u64)) -> (String, String) {
    if ran == 0 {
        return ("-".into(), String::new());
    }
    let rate = format!(
        "{}%",
        crate::stats::percent_label(passed as f64 / ran as f64)
    );
    let interval = crate::stats::wilson_interval(passed, ran, crate::stats::CONFIDENCE)
        .map_or_else(String::new, |i| format!("{}%", i.label()));
    (rate, interval)
}
