//! `report.html` and `junit.xml` content.

use trellis_reports::{ReportOptions, ReportWriter, write_reports};

use super::fixtures::write_complete_journal;

fn position(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the report"))
}

#[test]
fn html_is_escaped_self_contained_and_failures_first() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();

    assert!(
        !html.contains("<script>alert"),
        "agent text must be escaped"
    );
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external reference"
    );
    assert!(
        !html.contains(" src=") && !html.contains("<link"),
        "nothing loaded from elsewhere"
    );

    // Error, then failed, then skipped, then passed.
    let error = position(&html, "data-status=\"error\"");
    let failed = position(&html, "data-status=\"failed\"");
    let skipped = position(&html, "data-status=\"skipped\"");
    let passed = position(&html, "data-status=\"passed\"");
    assert!(error < failed && failed < skipped && skipped < passed);

    // Header, aggregates, failure reasons and the transcript.
    assert!(html.contains("run-1"));
    assert!(html.contains("75.0%"), "3 passed of 4 that ran");
    assert!(html.contains("By suite") && html.contains("By scenario") && html.contains("By agent"));
    assert!(html.contains("reply has no price: &lt;script&gt;"));
    assert!(html.contains("shared prefix · node start"));
    assert!(html.contains("node asks-price/then"));
    assert!(!html.contains("shared prefix · node asks-price/then"));
    assert!(html.contains("Let me check the service area."));
    assert!(
        html.contains("check_service_area")
            && html.contains("&quot;zone&quot;: &quot;V4T0A7&quot;")
    );
    assert!(html.contains("HTTP 503 from agent"));
    assert!(html.contains("needs a judge model"));
    assert!(html.contains("data-filter=\"failed\""));
    assert!(!html.contains("Not shown in full"));
}

#[test]
fn html_caps_transcripts_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let options = ReportOptions {
        max_failing_transcripts: 1,
        max_passing_transcripts: 1,
        ..ReportOptions::default()
    };
    let files = write_reports(dir.path(), &options).unwrap();
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert_eq!(html.matches("<section class=\"traj").count(), 2);
    assert!(html.contains("Not shown in full: 2 non-passing and 2 passing"));
    // The aggregates still count everything.
    assert!(html.contains("<b>6</b><span>trajectories</span>"));
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
    assert_eq!(files.written().count(), 7);
    let junit = std::fs::read_to_string(&files.junit).unwrap();
    assert!(junit.trim_end().ends_with("</testsuites>"));
    assert!(std::fs::metadata(&files.trajectories).unwrap().len() > 0);
}

#[test]
fn a_lost_journal_leaves_a_report_without_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ReportWriter::start(
        dir.path(),
        &super::fixtures::run_info(),
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
    assert!(!html.contains("<p><b>Transcript</b></p>"));
    assert!(html.contains("</html>"));
}

#[test]
fn replayed_and_function_call_turns_are_marked_in_the_transcript() {
    use trellis_engine::record::JournalEntry;
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
    assert!(html.contains("<b>replay</b> of the shared prefix"));
    assert!(html.contains("<span class=\"role\">call lookup_order</span>"));
    use polars::prelude::{ParquetReader, SerReader};
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
    use trellis_engine::protocol::ChatMessage;
    use trellis_engine::record::JournalEntry;
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
    assert!(html.contains("evil.example/x.png"));
    assert!(!html.contains("<img"), "nothing is loaded or injected");
}
