//! A journal written before the record types moved into this crate (the example suites run
//! by the `trellis` of that commit; lines chosen to cover every field the run wrote) still
//! decodes, and every entry encodes back to the same JSON it was read from (same fields
//! and values): the move changed no serde shape. Fields that are null may be left out:
//! journals now omit absent values, which read back as absent (docs/results.md, "The
//! journal").

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
        assert_eq!(
            without_nulls(again),
            without_nulls(read),
            "line {} encodes differently",
            i + 1
        );
    }
    // The fixture must keep covering every kind of entry and the statuses of the run.
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["agent", "node", "run_finished", "run_started", "trajectory"]
    );
    assert!(statuses.contains(TrajectoryStatus::Passed.as_str()));
    assert!(statuses.contains(TrajectoryStatus::Failed.as_str()));
}

/// `value` with every object field whose value is null removed, at any depth.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

#[test]
fn absent_values_are_left_out_of_the_journal_and_read_back_as_absent() {
    // A node line of a passed one-turn trajectory: no fault, no usage, no parent.
    let line = JOURNAL
        .lines()
        .find(|l| {
            l.starts_with("{\"node\":")
                && ["\"fault\":null", "\"ttft_ms\":null", "\"parent\":null"]
                    .iter()
                    .all(|absent| l.contains(absent))
        })
        .expect("the fixture has a root node line without a fault or usage");
    let entry: JournalEntry = serde_json::from_str(line).unwrap();
    let again = serde_json::to_string(&entry).unwrap();
    for absent in ["\"fault\":null", "\"ttft_ms\":null", "\"parent\":null"] {
        assert!(line.contains(absent), "the fixture line has {absent}");
        assert!(!again.contains(absent), "{absent} is written: {again}");
    }
    let back: JournalEntry = serde_json::from_str(&again).unwrap();
    assert_eq!(
        serde_json::to_string(&back).unwrap(),
        again,
        "reads back as it was written"
    );
}
