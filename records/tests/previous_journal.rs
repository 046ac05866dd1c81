//! A journal written before the record types moved into this crate (the example suites run
//! by the `trellis` of that commit; lines chosen to cover every field the run wrote) still
//! decodes, and every entry encodes back to the same JSON it was read from (same fields
//! and values): the move changed no serde shape.

use trellis_records::{JournalEntry, TrajectoryStatus};

const JOURNAL: &str = include_str!("fixtures/journal-before-records-crate.jsonl");

#[test]
fn a_journal_of_the_previous_schema_decodes_and_encodes_the_same_json() {
    let mut kinds = std::collections::BTreeSet::new();
    let mut statuses = std::collections::BTreeSet::new();
    for (i, line) in JOURNAL.lines().enumerate() {
        let entry: JournalEntry = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {}: does not decode: {e}", i + 1));
        kinds.insert(match &entry {
            JournalEntry::RunStarted(_) => "run_started",
            JournalEntry::Agent(_) => "agent",
            JournalEntry::Node(_) => "node",
            JournalEntry::Trajectory(t) => {
                statuses.insert(t.status.as_str());
                "trajectory"
            }
            JournalEntry::RunFinished(_) => "run_finished",
            // Newer than the fixture: late OpenTelemetry spans.
            JournalEntry::Spans(_) => "spans",
        });
        let again = serde_json::to_string(&entry).unwrap();
        let again: serde_json::Value = serde_json::from_str(&again).unwrap();
        let read: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(again, read, "line {} encodes differently", i + 1);
    }
    // The fixture must keep covering every kind of entry and the statuses of the run.
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["agent", "node", "run_finished", "run_started", "trajectory"]
    );
    assert!(statuses.contains(TrajectoryStatus::Passed.as_str()));
    assert!(statuses.contains(TrajectoryStatus::Failed.as_str()));
}
