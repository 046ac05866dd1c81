//! `report.html` in a real headless browser (`trellis_testkit::browser`: chromium over the
//! DevTools pipe, with every host unresolvable and every proxy request refused, so nothing
//! can be fetched).
//!
//! Checks that the page renders its scenarios after its script ran, that the filters work
//! when driven like a user does, that clicking the tree opens a transcript, that nothing is
//! requested but the file itself, and that hostile agent text stays text. Fails, saying so,
//! when no chromium binary is installed (`TRELLIS_CHROMIUM` names one explicitly).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use trellis_records::{JournalEntry, TrajectoryStatus};
use trellis_reports::{ReportOptions, write_reports};
use trellis_testkit::browser::{Browser, chromium};

use super::fixtures;

/// Agent text that would change the title, set a global or load an image if it ever
/// became markup.
const HOSTILE: &str = "</script><script>document.title='pwned';window.__pwned=1</script>\
    <img src=x onerror=\"document.title='pwned';window.__pwned=1\">\
    <svg onload=\"window.__pwned=1\"></svg>'\"&amp;";

/// An agent name that would break out of an attribute if it were not escaped.
const HOSTILE_AGENT: &str = "flaky\"><img src=x onerror=\"window.__pwned=1\">";

/// The fixture run with hostile text wherever agent, user or suite text reaches the page.
fn hostile_run(dir: &Path) -> PathBuf {
    let mut entries = fixtures::entries();
    for entry in &mut entries {
        match entry {
            JournalEntry::RunStarted(info) => {
                if let Some(sc) = std::sync::Arc::make_mut(info).scenarios.first_mut() {
                    sc.name = Some(HOSTILE.into());
                    sc.description = Some(HOSTILE.into());
                    sc.user_context.insert("note".into(), json!(HOSTILE));
                }
            }
            JournalEntry::Node(node) => {
                for turn in &mut node.turns {
                    let turn = std::sync::Arc::make_mut(turn);
                    if turn.reply.as_deref() == Some(fixtures::XSS) {
                        turn.reply = Some(HOSTILE.into());
                    }
                    for call in &mut turn.tool_calls {
                        call.result = Some(HOSTILE.into());
                    }
                }
            }
            JournalEntry::Trajectory(t) => {
                if t.status == TrajectoryStatus::Skipped {
                    t.agent = HOSTILE_AGENT.into();
                }
                t.captures.insert("quote".into(), HOSTILE.into());
                for c in &mut t.criteria {
                    if c.detail.is_some() && t.status == TrajectoryStatus::Failed {
                        c.detail = Some(format!("reply has no price: {HOSTILE}"));
                    }
                }
                t.tags.push(HOSTILE.into());
            }
            _ => {}
        }
    }
    entries.push(JournalEntry::RunFinished(fixtures::summary()));
    fixtures::write_journal(dir, &entries, "");
    write_reports(dir, &ReportOptions::default()).unwrap().html
}

#[test]
fn the_report_works_in_a_real_browser() {
    let binary = chromium();
    let dir = tempfile::tempdir().unwrap();
    // Its own parent: no other run directory next to it feeds the trends.
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let html = hostile_run(&run);
    let url = format!("file://{}", html.canonicalize().unwrap().display());

    let mut browser = Browser::launch(&binary);
    browser.page("Page.navigate", json!({"url": url}));
    browser.wait_for_event("Page.loadEventFired");

    // It renders: the script ran, every scenario and every trajectory row is there.
    assert_eq!(
        browser.eval("document.documentElement.dataset.ready"),
        "yes"
    );
    assert_eq!(browser.eval("document.title"), "Trellis run run-1");
    assert_eq!(
        browser.eval("document.querySelectorAll('section.scenario').length"),
        3
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('details.run').length"),
        6
    );
    assert_eq!(
        browser.eval("document.getElementById('shown').textContent"),
        "6 of 6 shown"
    );
    assert_eq!(
        browser.eval(
            "document.querySelectorAll('section.scenario')[0].querySelector('h3').textContent"
        ),
        "booking",
        "scenarios in plan order"
    );

    // Filters, driven as a user does.
    let visible = "Array.from(document.querySelectorAll('details.run')).filter(e => !e.hidden && e.offsetParent !== null).map(e => e.dataset.status + ':' + e.dataset.agent)";
    browser.eval("document.querySelector('button[data-status=failed]').click()");
    assert_eq!(browser.eval(visible), json!(["failed:demo"]));
    assert_eq!(
        browser.eval("document.getElementById('shown').textContent"),
        "1 of 6 shown"
    );
    assert_eq!(
        browser.eval("Array.from(document.querySelectorAll('section.scenario')).filter(s => !s.hidden).length"),
        1,
        "scenarios without a matching row are hidden"
    );
    browser.eval("document.querySelector('button[data-status=all]').click()");
    assert_eq!(browser.eval(visible).as_array().unwrap().len(), 6);

    let select = |id: &str, value: &str| {
        format!(
            "(() => {{ const s = document.getElementById('{id}'); s.value = {value:?}; \
             s.dispatchEvent(new Event('change', {{bubbles: true}})); }})()"
        )
    };
    browser.eval(&select("f-agent", "flaky"));
    assert_eq!(browser.eval(visible), json!(["error:flaky"]));
    browser.eval(&select("f-agent", HOSTILE_AGENT));
    assert_eq!(
        browser.eval(visible),
        json!([format!("skipped:{HOSTILE_AGENT}")]),
        "an agent name with quotes and markup round-trips through attributes"
    );
    browser.eval(&select("f-agent", ""));
    browser.eval(&select("f-suite", "shop"));
    assert_eq!(
        browser.eval("Array.from(document.querySelectorAll('section.scenario')).filter(s => !s.hidden).map(s => s.dataset.suite)"),
        json!(["shop"])
    );
    browser.eval(&select("f-suite", ""));
    browser.eval(
        "(() => { const q = document.getElementById('f-text'); q.value = 'HTTP 503'; \
         q.dispatchEvent(new Event('input', {bubbles: true})); })()",
    );
    assert_eq!(browser.eval(visible), json!(["error:flaky"]));

    // Clicking a repetition in the tree clears the filters and opens its transcript.
    browser.eval("document.querySelector('.treebox a.chip.failed').click()");
    assert_eq!(
        browser.eval("(() => { const t = document.getElementById(location.hash.slice(1)); return t.open && !t.hidden && t.dataset.status; })()"),
        "failed"
    );
    assert_eq!(browser.eval("document.getElementById('f-text').value"), "");
    // …and a node in the tree opens a transcript at that node.
    browser.eval("document.querySelector('.treebox a.tlabel').click()");
    assert_eq!(
        browser.eval("(() => { const n = document.getElementById(location.hash.slice(1)); return n.classList.contains('node') && n.closest('details.run').open; })()"),
        true
    );

    // Hostile text is inert: no script ran, no element was injected, the text is shown.
    assert_eq!(browser.eval("document.title"), "Trellis run run-1");
    assert_eq!(browser.eval("typeof window.__pwned"), "undefined");
    assert_eq!(browser.eval("document.scripts.length"), 1);
    assert_eq!(
        browser
            .eval("document.querySelectorAll('img, svg:not(.bar):not(.trend), iframe, object, embed').length"),
        0
    );
    assert_eq!(
        browser.eval(&format!(
            "document.body.textContent.split({HOSTILE:?}).length - 1 >= 5"
        )),
        true,
        "the hostile text is shown as text wherever it was put"
    );

    // Nothing but the file itself was requested, and nothing went wrong in the page.
    let requests: Vec<String> = browser
        .events_named("Network.requestWillBeSent")
        .iter()
        .map(|e| {
            e["params"]["request"]["url"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(requests, [url], "the page loaded something");
    let exceptions = browser.events_named("Runtime.exceptionThrown");
    assert!(exceptions.is_empty(), "script errors: {exceptions:?}");
    let logged: Vec<&Value> = browser
        .events_named("Log.entryAdded")
        .into_iter()
        .filter(|e| e["params"]["entry"]["level"] == "error")
        .collect();
    assert!(
        logged.is_empty(),
        "errors in the page (CSP violations?): {logged:?}"
    );
}

/// Long suite, scenario and agent names: one with spaces, two without (nowhere to wrap).
const LONG_SUITE: &str = "customer-support-regression-suite-for-the-duct-cleaning-booking-flow-v2";
const LONG_SCENARIO: &str =
    "a returning customer books a duct cleaning for two units and asks about prices twice";
const LONG_AGENT: &str = "demo-agent-with-a-very-long-deployment-name-eu-west-1-canary-2026-11-25";

/// The fixture run with long names, written as `report.html` under `dir`.
fn long_names_run(dir: &Path) -> PathBuf {
    let mut entries = fixtures::entries();
    entries.push(JournalEntry::RunFinished(fixtures::summary()));
    // Whole JSON string values only: the quotes are part of what is replaced.
    let renamed: Vec<JournalEntry> = entries
        .iter()
        .map(|entry| {
            let text = serde_json::to_string(entry)
                .unwrap()
                .replace("\"shop\"", &format!("{LONG_SUITE:?}"))
                .replace("\"booking\"", &format!("{LONG_SCENARIO:?}"))
                .replace("\"demo\"", &format!("{LONG_AGENT:?}"))
                // One unbroken value in the scenario's facts (a dataset cell, a context
                // field) spilled the page sideways.
                .replace("\"V4T 0A7\"", &format!("{:?}", "7".repeat(600)));
            serde_json::from_str(&text).unwrap()
        })
        .collect();
    fixtures::write_journal(dir, &renamed, "");
    write_reports(dir, &ReportOptions::default()).unwrap().html
}

/// Long names do not push a table's counts and rates out of its box: at a desktop width
/// (two tables side by side) and a narrow one (one column), every summary table fits its
/// section, the page does not scroll sideways (a long unbroken user-context value
/// included), and a shortened name has the full name on hover. `TRELLIS_SCREENSHOTS=DIR` saves what the browser drew at each width.
#[test]
fn long_names_fit_the_report_tables() {
    let binary = chromium();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let html = long_names_run(&run);
    let url = format!("file://{}", html.canonicalize().unwrap().display());

    let mut browser = Browser::launch(&binary);
    for width in [1280, 600] {
        browser.page(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        browser.page("Page.navigate", json!({"url": url}));
        browser.wait_for_event("Page.loadEventFired");
        assert_eq!(
            browser.eval("document.documentElement.dataset.ready"),
            "yes"
        );
        if let Some(shots) = std::env::var_os("TRELLIS_SCREENSHOTS") {
            let shot = browser.page("Page.captureScreenshot", json!({"format": "png"}));
            let png = base64_decode(shot["data"].as_str().unwrap());
            std::fs::write(Path::new(&shots).join(format!("report-{width}.png")), png).unwrap();
        }
        let tables = browser.eval(
            "Array.from(document.querySelectorAll('section.rates')).map(s => { \
               const t = s.querySelector('table'); \
               return [s.querySelector('h2').textContent, \
                       Math.round(t.getBoundingClientRect().width), s.clientWidth]; })",
        );
        let tables = tables.as_array().unwrap();
        assert_eq!(tables.len(), 3);
        for table in tables {
            assert!(
                table[1].as_f64().unwrap() <= table[2].as_f64().unwrap(),
                "at {width} px, table {} is wider than its box: {tables:?}",
                table[0]
            );
        }
        // Every rate cell is on screen.
        assert_eq!(
            browser.eval(
                "Array.from(document.querySelectorAll('section.rates td.n:nth-last-child(2)')) \
                 .filter(td => td.getBoundingClientRect().right > \
                               document.documentElement.clientWidth).length"
            ),
            0,
            "at {width} px"
        );
        assert_eq!(
            browser.eval(
                "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            ),
            true,
            "at {width} px the page scrolls sideways"
        );
        // The full names are there on hover.
        let titles = browser.eval(
            "Array.from(document.querySelectorAll('section.rates td.name')).map(td => td.title)",
        );
        for name in [LONG_SUITE, LONG_SCENARIO, LONG_AGENT] {
            assert!(
                titles
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t.as_str().is_some_and(|t| t.contains(name))),
                "{name} in {titles}"
            );
        }
    }
}

/// Standard base64, for the screenshots chromium sends.
fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// The compare page's filter, driven as a user does: with "only what changed" (the
/// default) a section where nothing changed is hidden whole, the note counting its unlisted
/// rows too; the count of rows shown is out of every row compared, not of those listed.
#[test]
fn the_compare_page_hides_sections_where_nothing_changed_with_their_notes() {
    let binary = chromium();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compare.html");
    let mut page = fixtures::compare_page("why");
    // 600 criteria, none changed: 500 listed, a note for the other 100.
    let template = page.criteria[0].clone();
    page.criteria = (0..600)
        .map(|i| {
            let mut r = template.clone();
            r.criterion = format!("check-{i}");
            r.rate.verdict = "unchanged".into();
            r
        })
        .collect();
    trellis_reports::write_compare(&path, &page).unwrap();
    let url = format!("file://{}", path.canonicalize().unwrap().display());

    let mut browser = Browser::launch(&binary);
    browser.page("Page.navigate", json!({"url": url}));
    browser.wait_for_event("Page.loadEventFired");
    assert_eq!(
        browser.eval("document.documentElement.dataset.ready"),
        "yes"
    );
    let visible_notes = "Array.from(document.querySelectorAll('p.note')).filter(p => p.offsetParent !== null).map(p => p.textContent)";
    let visible_titles = "Array.from(document.querySelectorAll('section.rows h2')).filter(h => h.offsetParent !== null).map(h => h.textContent)";
    assert_eq!(browser.eval(visible_notes), json!([]));
    assert_eq!(
        browser.eval(visible_titles),
        json!(["Scenarios 1 changed of 1", "Branches 1 changed of 2"])
    );
    assert_eq!(
        browser.eval("document.getElementById('shown').textContent"),
        "2 of 603 rows shown"
    );
    // Every row: the criteria come back with their note.
    browser.eval("document.getElementById('only-changes').click()");
    let notes = browser.eval(visible_notes);
    assert_eq!(notes.as_array().map(Vec::len), Some(1), "{notes}");
    assert!(
        notes[0]
            .as_str()
            .unwrap_or("")
            .contains("100 more that did not"),
        "{notes}"
    );
    assert_eq!(
        browser.eval("document.getElementById('shown').textContent"),
        "503 of 603 rows shown"
    );
}
