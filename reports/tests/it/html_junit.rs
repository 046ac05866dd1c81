//! `report.html` and `junit.xml` content.

use trellis_reports::{ReportOptions, ReportWriter, write_reports};

use super::fixtures::write_complete_journal;

fn position(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the report"))
}

#[test]
fn html_is_escaped_self_contained_and_in_stable_order() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();

    assert!(
        !html.contains("<script>alert"),
        "agent text must be escaped"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"));
    assert!(html.contains("Booking with a &lt;b&gt;price&lt;&#x2f;b&gt; question"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external reference"
    );
    assert!(
        !html.contains(" src=") && !html.contains("<link"),
        "nothing loaded from elsewhere"
    );
    assert!(html.contains(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'sha256-"
    ));
    assert_eq!(html.matches("<script>").count(), 1);

    // Plan order for scenarios, then branch, agent and repetition; not finishing order.
    let booking = position(&html, "id=\"s0\" data-suite=\"shop\"");
    let later = position(&html, "id=\"s1\" data-suite=\"smoke\"");
    let ping = position(&html, "id=\"s2\" data-suite=\"smoke\"");
    assert!(booking < later && later < ping);
    let rows: Vec<usize> = ["s0-t0-a0-r0", "s0-t0-a0-r1", "s0-t1-a0-r0", "s0-t1-a0-r1"]
        .iter()
        .map(|id| position(&html, &format!("id=\"{id}\" data-status")))
        .collect();
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "{rows:?}");

    // Header, aggregates, the scenario and who the user is.
    assert!(html.contains("run-1"));
    assert!(html.contains("75.0%"), "3 passed of 4 that ran");
    assert!(html.contains("By suite") && html.contains("By scenario") && html.contains("By agent"));
    assert!(html.contains("The customer books a duct cleaning."));
    assert!(html.contains("<code>polite-customer</code>"));
    assert!(html.contains("Polite, gives details when asked"));
    assert!(html.contains("postal_code</span> V4T 0A7"));

    // The tree: pass counts per node, where the failure happened, repetitions grouped.
    assert!(html.contains(">shared start</a>"));
    assert!(html.contains("4/4 passed"), "the shared start");
    assert!(html.contains(">branch «asks-price»</a>"));
    assert!(html.contains("1 failed here"));
    let mixed = position(
        &html,
        "title=\"repetitions that passed, of those that ran\">1/2</span>",
    );
    let after = &html[mixed..mixed + 900];
    assert!(
        after.contains(">pass@1 50% (95% CI 9–91%)</span>"),
        "{after}"
    );
    assert!(after.contains("<span class=\"flaky\""), "{after}");
    assert!(html.contains("title=\"repetitions that passed, of those that ran\">2/2</span>"));

    // The failing criterion and why on the collapsed row, with a human place; turns are
    // numbered as `turn_index` in the Parquet tables (from 0), as in every other output.
    let failed_row = &html[position(&html, "id=\"s0-t1-a0-r1\"")..];
    let summary = &failed_row[..position(failed_row, "</summary>")];
    assert!(
        summary.contains("reply matches=&quot;\\$\\d+&quot; (turn 2, after the fork «asks-price»)"),
        "{summary}"
    );
    assert!(summary.contains("reply has no price: &lt;script&gt;"));

    // Transcript: labelled nodes, shared prefix, siblings linked, tool calls, faults.
    assert!(html.contains("shared prefix · shared by 2 trajectories"));
    assert!(html.contains("other branches: <a href=\"#s0-t0-a0-r1-n1\">branch «accepts»</a>"));
    assert!(html.contains("<b>turn 2</b>, after the fork «asks-price»"));
    assert!(html.contains("Let me check the service area."));
    assert!(
        html.contains("check_service_area")
            && html.contains("{&quot;zone&quot;:&quot;V4T0A7&quot;}")
    );
    assert!(html.contains("HTTP 503 from agent"));
    assert!(html.contains("needs a judge model"));
    // Captured values.
    assert!(html.contains("<dt>quote</dt><dd><code>120</code></dd>"));
    assert!(html.contains("data-status=\"failed\""));
    assert!(!html.contains("Not listed here"));
}

#[test]
fn junit_has_a_case_per_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let xml = std::fs::read_to_string(&files.junit).unwrap();

    assert_eq!(xml.matches("<testsuite ").count(), 2);
    assert_eq!(xml.matches("<testcase ").count(), 6);
    assert_eq!(xml.matches("<failure").count(), 1);
    assert_eq!(xml.matches("<error").count(), 1);
    assert_eq!(xml.matches("<skipped").count(), 1);
    assert!(xml.contains("name=\"booking/asks-price [demo #1]\""));
    assert!(xml.contains("reply has no price"));
    assert!(xml.contains("http_5xx"));
    assert!(xml.contains("needs a judge model"));
    assert!(
        xml.contains("tests=\"6\"")
            && xml.contains("failures=\"1\"")
            && xml.contains("errors=\"1\"")
    );
}

#[test]
fn a_file_that_cannot_be_written_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    // A directory where report.html goes: the finished page cannot be moved into place.
    std::fs::create_dir(dir.path().join("report.html")).unwrap();
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let missing: Vec<&std::path::Path> =
        files.not_written.iter().map(|(p, _)| p.as_path()).collect();
    assert_eq!(missing, [files.html.as_path()]);
    assert!(files.is_missing(&files.html));
    assert_eq!(files.written().count(), 9);
    let junit = std::fs::read_to_string(&files.junit).unwrap();
    assert!(junit.trim_end().ends_with("</testsuites>"));
    assert!(std::fs::metadata(&files.trajectories).unwrap().len() > 0);
}

#[test]
fn a_lost_journal_leaves_a_report_without_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ReportWriter::start(
        dir.path(),
        &std::sync::Arc::new(super::fixtures::run_info()),
        &ReportOptions::default(),
    )
    .unwrap();
    for entry in super::fixtures::entries() {
        writer.push(&entry);
    }
    // No journal on disk at all: it could not be written.
    writer.journal_lost("the journal could not be written (disk full)");
    let files = writer.finish();
    assert!(files.not_written.is_empty(), "{:?}", files.not_written);
    assert!(files.transcripts_missing.is_some());
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(
        html.contains("Transcripts are not shown: the journal could not be written (disk full)")
    );
    assert!(!html.contains("<div class=\"node"));
    assert!(html.contains("</html>"));
}

/// The page renders the first passed trajectories and every failure: a failure that comes
/// after the passed ones the page has room for still gets its transcript.
#[test]
fn a_late_failure_gets_its_transcript_past_the_capped_passed_ones() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let options = ReportOptions {
        max_passing_transcripts: 1,
        ..ReportOptions::default()
    };
    let files = write_reports(dir.path(), &options).unwrap();
    assert!(files.transcripts_missing.is_none());
    let html = std::fs::read_to_string(&files.html).unwrap();
    // The fourth trajectory of the journal, failed, and its reply from its own node.
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;</pre>"),
        "{html}"
    );
    // The errored one after it, and the first passed one.
    assert!(html.contains("HTTP 503 from agent"));
    assert!(html.contains("Booked for Tuesday."));
}

/// Once the rendered trajectories' nodes are found, the journal after the last of them is
/// not read: a node recorded again after it (journals put end to end) is not the one the
/// trajectory went through.
#[test]
fn the_journal_past_the_last_rendered_trajectory_is_not_read() {
    use trellis_records::JournalEntry;
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    let mut again = entries
        .iter()
        .find_map(|e| match e {
            JournalEntry::Node(node) if node.node == "accepts" => Some(node.clone()),
            _ => None,
        })
        .unwrap();
    let turn = again
        .turns
        .first_mut()
        .map(std::sync::Arc::make_mut)
        .unwrap();
    turn.reply = Some("Recorded again later.".into());
    turn.messages = vec![trellis_records::ChatMessage::assistant(
        "Recorded again later.",
    )];
    entries.push(JournalEntry::Node(again));
    super::fixtures::write_journal(dir.path(), &entries, "");
    let options = ReportOptions {
        max_passing_transcripts: 1,
        max_failing_transcripts: 0,
        ..ReportOptions::default()
    };
    let files = write_reports(dir.path(), &options).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("Booked for Tuesday."), "{html}");
    assert!(!html.contains("Recorded again later."));
}

#[test]
fn replayed_and_function_call_turns_are_marked_in_the_transcript() {
    use trellis_records::JournalEntry;
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    let turn = entries
        .iter_mut()
        .find_map(|e| match e {
            JournalEntry::Node(node) if !node.turns.is_empty() => node.turns.first_mut(),
            _ => None,
        })
        .map(std::sync::Arc::make_mut)
        .unwrap();
    turn.replay = true;
    turn.kind = "call".into();
    turn.function = Some("lookup_order".into());
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("<div class=\"turn replay\">"));
    assert!(html.contains(">replayed</span>"));
    assert!(html.contains("<span class=\"role\">call lookup_order</span>"));
    use polars_io::prelude::{ParquetReader, SerReader};
    let turns = ParquetReader::new(std::fs::File::open(&files.turns).unwrap())
        .finish()
        .unwrap();
    assert_eq!(
        turns.column("replay").unwrap().bool().unwrap().sum(),
        Some(1)
    );
}

/// Content that is not text (images, data, embeds) is shown as inert JSON text: an image URL
/// is never loaded.
#[test]
fn content_parts_are_shown_as_text_never_loaded() {
    use trellis_records::ChatMessage;
    use trellis_records::JournalEntry;
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    let turn = entries
        .iter_mut()
        .find_map(|e| match e {
            JournalEntry::Node(node) if !node.turns.is_empty() => node.turns.first_mut(),
            _ => None,
        })
        .map(std::sync::Arc::make_mut)
        .unwrap();
    let mut message = ChatMessage::assistant("Here is the chart.");
    message.parts = vec![serde_json::json!({
        "type": "image",
        "image_url": "https://evil.example/x.png\"><img src=x onerror=alert(1)>"
    })];
    turn.messages.insert(0, message);
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("content part"), "parts are shown");
    assert!(html.contains("evil.example&#x2f;x.png"));
    assert!(!html.contains("<img"), "nothing is loaded or injected");
}

#[test]
fn control_and_bidi_characters_an_agent_sends_are_shown_escaped() {
    use trellis_records::JournalEntry;
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    let turn = entries
        .iter_mut()
        .find_map(|e| match e {
            JournalEntry::Node(node) if !node.turns.is_empty() => node.turns.first_mut(),
            _ => None,
        })
        .map(std::sync::Arc::make_mut)
        .unwrap();
    // A NUL makes the file "binary" to grep; a right-to-left override reverses the rest
    // of a row (agent name, repetition) in the browser.
    turn.reply = Some("nul\u{0} then \u{202e}reversed\u{1b}[2J".into());
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    for raw in ['\u{0}', '\u{202e}', '\u{1b}'] {
        assert!(!html.contains(raw), "{raw:?} written raw");
    }
    assert!(
        html.contains(r"nul\u{0} then \u{202e}reversed\u{1b}[2J"),
        "shown as escapes"
    );
}

#[test]
fn a_check_whose_judge_failed_is_what_its_error_row_says_went_wrong() {
    use trellis_records::{CriterionRecord, CriterionStatus, JournalEntry, TrajectoryStatus};
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    let t = entries
        .iter_mut()
        .find_map(|e| match e {
            JournalEntry::Trajectory(t) => Some(t),
            _ => None,
        })
        .unwrap();
    t.status = TrajectoryStatus::Error;
    t.fault = None;
    let check = |text: &str, status, detail: &str| CriterionRecord {
        turn_index: Some(0),
        criterion: text.into(),
        kind: text.split_whitespace().next().unwrap().into(),
        status,
        detail: Some(detail.into()),
        judge: None,
    };
    // The failed reply check comes first: the row still names the judge that failed, as
    // that is what makes it `error`.
    t.criteria = vec![
        check(
            "reply contains=\"x\"",
            CriterionStatus::Failed,
            "expected the reply to contain \"x\"",
        ),
        check(
            "judge \"is fine\"",
            CriterionStatus::Error,
            "the judge gave no verdict: it answered \"maybe\"",
        ),
    ];
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(
        html.contains("check error · judge &quot;is fine&quot; (turn 0"),
        "the headline names the check that erred"
    );
    assert!(html.contains("2 checks: 0 passed, 1 failed, 1 error"));
    let failed = html.split("<h5>Failed checks</h5>").nth(1).unwrap();
    let failed = failed.split("</ul>").next().unwrap();
    assert!(failed.contains("the judge gave no verdict"), "{failed}");
}

/// Each scenario's pass rate over the runs next to this one, oldest first, this run last.
#[test]
fn html_draws_each_scenarios_trend_from_the_runs_next_to_it() {
    use trellis_records::JournalEntry;
    let dir = tempfile::tempdir().unwrap();
    let (earlier, later) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&earlier).unwrap();
    std::fs::create_dir(&later).unwrap();
    write_complete_journal(&earlier);
    write_reports(&earlier, &ReportOptions::default()).unwrap();
    let first = std::fs::read_to_string(earlier.join("report.html")).unwrap();
    assert!(!first.contains("<svg class=\"trend\""), "no earlier run");

    let mut entries = super::fixtures::entries();
    if let Some(JournalEntry::RunStarted(info)) = entries.first_mut() {
        let info = std::sync::Arc::make_mut(info);
        info.run_id = "run-2".into();
        info.started_at = "2025-01-02T10:00:00Z".into();
    }
    entries.push(JournalEntry::RunFinished(super::fixtures::summary()));
    super::fixtures::write_journal(&later, &entries, "");
    let files = write_reports(&later, &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("<svg class=\"trend\""));
    let earlier_bar = position(
        &html,
        "<title>run-1 · 2025-01-01T10:00:00Z: 3&#x2f;4 passed (75.0%)</title>",
    );
    let this_bar = position(
        &html,
        "<title>this run · run-2 · 2025-01-02T10:00:00Z: 3&#x2f;4 passed (75.0%)</title>",
    );
    assert!(earlier_bar < this_bar);

    // Trends can be turned off.
    let options = ReportOptions {
        trend_runs: 0,
        ..ReportOptions::default()
    };
    let files = write_reports(&later, &options).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(!html.contains("<svg class=\"trend\""));
}

#[test]
fn the_compare_page_shows_regressions_first_and_escapes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compare.html");
    trellis_reports::write_compare(&path, &super::fixtures::compare_page(super::fixtures::XSS))
        .unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(!html.contains("<script>alert"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"));
    assert!(html.contains("default-src 'none'"));
    assert!(!html.contains("http://") && !html.contains(" src="));
    assert!(html.contains("<title>Trellis compare nightly → run-2</title>"));
    assert!(position(&html, "<b>Regressed</b>") < position(&html, "<h2>Scenarios"));
    assert!(html.contains("4&#x2f;4 · 100.0%") && html.contains("3&#x2f;4 · 75.0%"));
    assert!(html.contains("−50.0 pts"), "the failing branch");
    assert!(html.contains("p = 0.012"));
    assert!(html.contains("−25.0 pts"), "pass rate metric as points");
    assert!(html.contains("<span class=\"verdict regressed\">regressed</span>"));
    assert!(html.contains("data-changed=\"no\""));
    // Turns numbered from 0, as `turn_index` in the tables (the fixture's row is turn 2).
    assert!(html.contains("shop &#x2f; booking &#x2f; asks-price · demo · turn 2"));
    // What each section's rate counts, and what "noise" means, are on the page.
    assert!(html.contains("counts its repetitions in which every branch passed"));
    assert!(html.contains("one-sided Fisher exact test"));
    // A note that qualifies the verdict is shown with it.
    let mut page = super::fixtures::compare_page("why");
    page.notes = vec!["the base run was made without --strict".into()];
    trellis_reports::write_compare(&path, &page).unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.contains("Note: the base run was made without --strict"));
}

/// Two runs of many unchanged scenarios: the page lists what changed and a bounded number
/// of the rest, and says how many it left to compare.json.
#[test]
fn the_compare_page_lists_what_changed_and_only_some_of_what_did_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("compare.html");
    let mut page = super::fixtures::compare_page("why");
    let template = page.scenarios[0].clone();
    let regressed = {
        let mut r = template.clone();
        r.scenario = "the-regressed-one".into();
        r.rate.verdict = "regressed".into();
        r
    };
    page.scenarios = (0..2_000)
        .map(|i| {
            let mut r = template.clone();
            r.scenario = format!("case-{i}");
            r.rate.verdict = "unchanged".into();
            r
        })
        .chain(std::iter::once(regressed))
        .collect();
    trellis_reports::write_compare(&path, &page).unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(
        html.contains("1 changed of 2001"),
        "the counts are the whole comparison"
    );
    assert!(
        html.contains("the-regressed-one"),
        "what changed is listed, past the cap"
    );
    assert!(
        html.contains("id=\"s2000\""),
        "anchored by its place in the comparison"
    );
    assert!(html.contains(">case-499<") && !html.contains(">case-500<"));
    assert!(html.contains("1500 more that did not"));
}

/// A run stopped after every planned trajectory was recorded (its last ones cut short: a
/// judge not asked, a call not made) says so on its page, as its JUnit does; "covers 6 of 6
/// planned trajectories (100.0%)" read as a whole run.
#[test]
fn a_stopped_run_with_every_trajectory_recorded_says_some_were_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    if let Some(trellis_records::JournalEntry::RunStarted(info)) = entries.first_mut() {
        std::sync::Arc::make_mut(info).planned_trajectories = 6;
    }
    let mut summary = super::fixtures::summary();
    summary.interrupted = true;
    entries.push(trellis_records::JournalEntry::RunFinished(summary));
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("Stopped before its end"), "{html}");
    assert!(
        html.contains("all 6 planned trajectories are recorded, some of them cut short"),
        "{html}"
    );
    assert!(!html.contains("covers 6 of 6"), "{html}");
}

/// A stopped run whose agents forked records more trajectories than it planned: its JUnit
/// says so instead of "8 of 6 planned trajectories recorded".
#[test]
fn a_stopped_run_whose_agents_forked_says_so_in_junit() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = super::fixtures::entries();
    if let Some(trellis_records::JournalEntry::RunStarted(info)) = entries.first_mut() {
        std::sync::Arc::make_mut(info).planned_trajectories = 4;
    }
    let mut summary = super::fixtures::summary();
    summary.interrupted = true;
    entries.push(trellis_records::JournalEntry::RunFinished(summary));
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let junit = std::fs::read_to_string(&files.junit).unwrap();
    assert!(
        junit
            .contains("6 trajectories recorded, with those its agents forked beyond the 4 planned"),
        "{junit}"
    );
    assert!(!junit.contains("6 of 4 planned"), "{junit}");
}

/// A run that stopped early says how much of the plan it covers, in the header and per
/// scenario, instead of reading like a complete run.
#[test]
fn an_interrupted_run_says_how_much_of_the_plan_it_covers() {
    let dir = tempfile::tempdir().unwrap();
    let mut info = super::fixtures::run_info();
    info.planned_trajectories = 10;
    if let Some(booking) = info.scenarios.first_mut() {
        booking.trajectories.push("cancels".into());
    }
    let info = std::sync::Arc::new(info);
    let mut writer = ReportWriter::start(dir.path(), &info, &ReportOptions::default()).unwrap();
    let mut entries = super::fixtures::entries();
    entries[0] = trellis_records::JournalEntry::RunStarted(info);
    super::fixtures::write_journal(dir.path(), &entries, "");
    for entry in &entries {
        writer.push(entry);
    }
    let files = writer.finish();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("Did not finish"));
    assert!(html.contains("this report covers 6 of 10 planned trajectories (60.0%)"));
    assert!(html.contains("<div class=\"card rate partial\">"));
    assert!(html.contains("pass rate of 6 recorded, plan 10"));
    assert!(html.contains("4 of 6 planned trajectories recorded"));
    let unrun = &html[position(&html, "<div class=\"unrun\">")..];
    assert!(unrun.starts_with(
        "<div class=\"unrun\"><span class=\"meta\">did not run:</span><div class=\"leaf\"><span class=\"leaf-name\">«cancels»</span> <span class=\"note\">not recorded: the run stopped before it</span>"
    ), "{}", &unrun[..300]);
}
