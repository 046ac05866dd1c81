//! Planning: `needs` across suites resolve to the scenario validation accepted and run in
//! order against the builtin booking agent; what cannot run yet is planned as skipped per
//! protocol.

use std::collections::BTreeMap;
use std::sync::Arc;

use trellis_dsl::Protocol;
use trellis_engine::plan::{Plan, Selection};
use trellis_engine::protocol::{connexity, fixie};
use trellis_engine::record::TrajectoryStatus;
use trellis_engine::render::EnvSnapshot;

fn load_files(files: &[(&str, &str)]) -> (tempfile::TempDir, trellis_dsl::Project) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    match trellis_dsl::load(&[dir.path()], &trellis_engine::protocol::registry::specs()) {
        Ok(p) => (dir, p),
        Err(d) => panic!("{}", d.render_plain()),
    }
}

const X: &str = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "y" { user "Hi, my postal code is V4T 0A7."; expect no-error; }
"#;
const Z: &str = r#"
scenario "y" { needs "x/y"; user "Hello"; expect no-error; }
"#;

#[tokio::test]
async fn a_cross_suite_need_runs_first_and_the_dependent_still_runs() {
    let (_dir, project) = load_files(&[("x.kdl", X), ("z.kdl", Z)]);
    let plan = Plan::build_with_env(
        &project,
        &Selection::default(),
        Arc::new(EnvSnapshot::new()),
    )
    .unwrap();
    let name = |i: usize| {
        let s = &plan.scenarios[i];
        format!("{}/{}", s.suite, s.scenario.id.value)
    };
    let dependent = (0..plan.scenarios.len())
        .find(|&i| name(i) == "z/y")
        .unwrap();
    let needs: Vec<String> = plan.scenarios[dependent]
        .needs
        .iter()
        .map(|&i| name(i))
        .collect();
    assert_eq!(
        needs,
        ["x/y"],
        "`needs \"x/y\"` is suite x's y, never z/y itself"
    );

    let finished = crate::support::run_plan(plan, 4).await.trajectories;
    let order: Vec<String> = finished
        .iter()
        .map(|t| format!("{}/{}", t.suite, t.scenario))
        .collect();
    assert_eq!(order, ["x/y", "z/y"]);
    assert!(
        finished
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed),
        "{finished:#?}"
    );
}

#[test]
fn user_steps_are_not_runnable_on_fixie_agents_only() {
    let suite = r#"
agent "chat" protocol="connexity" builtin="booking"
agent "calc" protocol="fixie" url="http://127.0.0.1:9/"
agent "llm" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m"
scenario "talk" {
    agents "chat" "calc" "llm"
    user "hi"
    branch "simulated" { simulate turns=2 }
    branch "scripted" { user "bye" }
}
"#;
    let (_dir, project) = load_files(&[("s.kdl", suite)]);
    let plan = Plan::build_with_env(
        &project,
        &Selection::default(),
        Arc::new(EnvSnapshot::new()),
    )
    .unwrap();
    let agent = |id: &str| plan.agents.iter().find(|a| &*a.id == id).unwrap();
    assert!(agent("chat").unsupported.is_none());
    assert!(
        agent("calc").unsupported.is_none(),
        "fixie is a protocol trellis runs"
    );
    assert!(
        agent("llm").unsupported.is_none(),
        "openai is a protocol trellis runs"
    );

    let s = &plan.scenarios[0];
    let t = |name: &str| s.trajectories.iter().find(|t| t.name == name).unwrap();
    let simulated = t("simulated");
    assert!(
        simulated
            .unsupported_on(Protocol::new(&connexity::SPEC))
            .unwrap()
            .contains("simulate")
    );
    let scripted = t("scripted");
    assert_eq!(
        scripted.unsupported_on(Protocol::new(&connexity::SPEC)),
        None
    );
    assert!(
        scripted
            .unsupported_on(Protocol::new(&fixie::SPEC))
            .unwrap()
            .contains("`fixie`")
    );
}

/// A run's start lists every scenario's persona without building the scenario's template
/// scope (built for each of a dataset's 20,000 instances at once, the scopes were a tenth of
/// the run's memory; one built to fill in a persona's templates is not the one kept); a
/// scope built for rendering is held until released, then built again.
#[test]
fn the_persona_is_listed_without_building_the_scope_and_a_released_scope_is_rebuilt() {
    let (_dir, project) = load_files(&[(
        "p.kdl",
        r#"
agent "demo" protocol="connexity" builtin="booking"
persona "ann" type="polite" description="Ann, in {{ scenario.id }}"
scenario "s" { persona "ann"; user "Hi {{ persona.id }}"; expect no-error; }
"#,
    )]);
    let plan = Plan::build_with_env(
        &project,
        &Selection::default(),
        Arc::new(EnvSnapshot::new()),
    )
    .unwrap();
    let info = trellis_engine::execute::run_info(&plan, "r", 1, false);
    let scope = &plan.scenarios[0].scope;
    assert!(!scope.is_built(), "the run's start built the scope");
    let persona = info.scenarios[0].persona.as_ref().expect("persona listed");
    assert_eq!(persona["id"], "ann");
    assert_eq!(persona["type"], "polite");
    // Filled in by the scenario that plays it, as the simulated user reads it.
    assert_eq!(persona["description"], "Ann, in s");

    let rendered = |scope: &trellis_engine::render::ScenarioScope| {
        plan.templates
            .render_source("{{ persona.id }} {{ scenario.id }}", || {
                scope.with_vars(&Default::default())
            })
            .unwrap()
    };
    assert_eq!(rendered(scope), "ann s");
    assert!(scope.is_built());
    scope.release();
    assert!(!scope.is_built());
    assert_eq!(rendered(scope), "ann s");
}

/// A scenario without a `name` is named by its id in templates, not by the word `null`.
#[test]
fn a_scenario_without_a_name_is_named_by_its_id() {
    let (_dir, project) = load_files(&[(
        "p.kdl",
        r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "s" { user "Hi"; expect no-error; }
scenario "t" { name "The T case"; user "Hi"; expect no-error; }
"#,
    )]);
    let plan = Plan::build_with_env(
        &project,
        &Selection::default(),
        Arc::new(EnvSnapshot::new()),
    )
    .unwrap();
    let names: Vec<String> = plan
        .scenarios
        .iter()
        .map(|s| {
            plan.templates
                .render_source("{{ scenario.name }}", || {
                    s.scope.with_vars(&Default::default())
                })
                .unwrap()
        })
        .collect();
    assert_eq!(names, ["s", "The T case"]);
}

/// A render converts for templates only the variables its template reads: an instance of a
/// dataset that renders `{{ row.q }}` converts its row, not its scenario, persona or user
/// context. Each variable reads as before, the render's own `vars` and extra variables
/// replace same-named ones, and the scope lists its names in order.
#[test]
fn a_render_converts_only_the_variables_its_template_reads() {
    let (_dir, project) = load_files(&[
        (
            "p.kdl",
            r#"
agent "demo" protocol="connexity" builtin="booking"
persona "ann" type="polite" description="Ann"
dataset "rows" path="rows.csv"
scenario "s" for-each="rows" {
    persona "ann"
    user-context { day "Tuesday" }
    user "{{ row.q }}"
    expect no-error
}
"#,
        ),
        ("rows.csv", "q,n\nhello,3\n"),
    ]);
    let env = Arc::new(EnvSnapshot::from([(
        "HOME".to_owned(),
        "/home/ann".to_owned(),
    )]));
    let plan = Plan::build_with_env(&project, &Selection::default(), env).unwrap();
    let scope = &plan.scenarios[0].scope;
    let render = |source: &str, vars: &[(&str, &str)]| {
        let vars = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        plan.templates
            .render_source(source, || scope.with_vars(&vars))
            .unwrap()
    };
    assert_eq!(render("{{ row.q }} {{ row.n + 1 }}", &[]), "hello 4");
    assert_eq!(scope.converted(), ["row"]);
    assert_eq!(
        render(
            "{{ scenario.id[:2] }} {{ persona.id }} {{ user_context.day }} {{ env.HOME }} {{ vars.x }}",
            &[("x", "1")]
        ),
        "s[ ann Tuesday /home/ann 1"
    );
    assert_eq!(
        scope.converted(),
        ["row", "scenario", "user_context", "persona"]
    );

    let ctx = scope.with_vars_and(
        &BTreeMap::from([("x".to_owned(), "1".to_owned())]),
        BTreeMap::from([
            ("vars".to_owned(), minijinja::Value::from("extra")),
            ("history".to_owned(), minijinja::Value::from(2)),
        ]),
    );
    let names: Vec<String> = ctx
        .try_iter()
        .unwrap()
        .map(|name| name.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "env",
            "history",
            "persona",
            "row",
            "scenario",
            "user_context",
            "vars"
        ]
    );
    assert_eq!(ctx.get_attr("vars").unwrap().to_string(), "extra");
    assert!(ctx.get_attr("typo").unwrap().is_undefined());
    scope.release();
    assert!(scope.converted().is_empty());
}

/// A `row-id` that is one expression takes its id from the expression's value, without
/// rendering the template after evaluating it: the ids are those the rendered template
/// gives, for text (spaces, a composed accent), whole and decimal numbers, and booleans.
#[test]
fn a_lone_row_id_expression_gives_the_ids_its_rendered_template_does() {
    let suite = r#"
agent "demo" protocol="connexity" builtin="booking"
dataset "rows" path="rows.csv"
scenario "lone" for-each="rows" {
    row-id "{{ row.k }}"
    user "hi"
}
scenario "rendered" for-each="rows" {
    row-id "{{ row.k }}{{ '' }}"
    user "hi"
}
scenario "controlled" for-each="rows" {
    row-id "{{- row.k -}}"
    user "hi"
}
"#;
    let rows = "k\nplain\ntwo words\n  padded  \ncafe\u{301}\n7\n-12\n2.5\n2.0\n1e3\n\
                 18446744073709551616\ntrue\n";
    let (_dir, project) = load_files(&[("p.kdl", suite), ("rows.csv", rows)]);
    let ids = |base: &str| -> Vec<String> {
        project
            .scenarios()
            .filter_map(|(_, sc)| sc.instance.as_deref())
            .filter(|i| i.base == base)
            .filter_map(|i| i.row_id.clone())
            .collect()
    };
    let lone = ids("lone");
    assert_eq!(lone.len(), 11, "{lone:?}");
    assert_eq!(lone, ids("rendered"));
    assert_eq!(lone, ids("controlled"));
    assert!(lone.contains(&"two words".to_owned()) && lone.contains(&"café".to_owned()));
}
