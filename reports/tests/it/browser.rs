//! `report.html` in a real headless browser (`trellis_testkit::browser`: chromium over the
//! DevTools pipe, with every host unresolvable and every proxy request refused, so nothing
//! can be fetched).
//!
//! Checks that the page renders its scenarios after its script ran, that the filters work
//! when driven like a user does, that clicking the tree opens a transcript, that nothing is
//! requested but the file itself, and that hostile agent text stays text. Skips, saying so,
//! when no chromium binary is installed (`TRELLIS_CHROMIUM` names one explicitly).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use trellis_engine::record::{JournalEntry, TrajectoryStatus};
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
                if let Some(sc) = info.scenarios.first_mut() {
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
    let Some(binary) = chromium() else {
        // Straight to stderr, not through the test harness's capture: a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED the_report_works_in_a_real_browser: no chromium binary on PATH \
             (install chromium, or set TRELLIS_CHROMIUM to a Chrome/Chromium binary)"
        );
        return;
    };
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

