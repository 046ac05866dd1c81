//! The journal file through its writer and reader: entries come back as written, a stream
//! cut at any byte gives back every trajectory flushed before the cut, and plain journals of
//! earlier versions read the same way.

use std::io::Write;

use trellis_journal::{JournalReader, JournalWriter};
use trellis_records::{JournalEntry, NodeRecord, RunSummary};

fn node(i: u32) -> JournalEntry {
    JournalEntry::Node(NodeRecord {
        suite: "s".into(),
        scenario: "c".into(),
        agent: "a".into(),
        repetition: i,
        node: "start".into(),
        parent: None,
        turns: Vec::new(),
    })
}

/// A run summary stands in for a trajectory entry: any entry but a node is flushed.
fn finished(i: u32) -> JournalEntry {
    JournalEntry::RunFinished(RunSummary {
        run_id: format!("run-{i}"),
        trajectories: u64::from(i),
        ..RunSummary::default()
    })
}

fn read_all(path: &std::path::Path) -> (Vec<String>, JournalReader) {
    let mut reader = JournalReader::open(path).unwrap();
    let mut lines = Vec::new();
    while let Some(entry) = reader.next_entry().unwrap() {
        lines.push(serde_json::to_string(&entry).unwrap());
    }
    (lines, reader)
}

#[test]
fn entries_come_back_as_written_and_the_file_is_zstd() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = JournalWriter::create(dir.path()).unwrap();
    let mut expected = Vec::new();
    for i in 0..200 {
        for entry in [node(i), finished(i)] {
            writer.append(&entry).unwrap();
            expected.push(serde_json::to_string(&entry).unwrap());
        }
    }
    let path = writer.finish().unwrap();
    assert_eq!(path, dir.path().join(trellis_journal::FILE));
    assert_eq!(trellis_journal::find(dir.path()), Some(path.clone()));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    let plain: usize = expected.iter().map(|l| l.len() + 1).sum();
    assert!(
        bytes.len() * 5 < plain,
        "{} bytes for {plain} of JSON",
        bytes.len()
    );
    let (lines, reader) = read_all(&path);
    assert_eq!(lines, expected);
    assert_eq!(reader.skipped(), 0);
    assert!(!reader.cut_short());
}

#[test]
fn a_stream_cut_anywhere_keeps_every_entry_flushed_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(trellis_journal::FILE);
    let mut writer = JournalWriter::create_at(&path).unwrap();
    // The file's length after each flushed entry: a cut at or after it keeps the entry.
    let mut flushed_at = Vec::new();
    for i in 0..40 {
        writer.append(&node(i)).unwrap();
        writer.append(&finished(i)).unwrap();
        flushed_at.push(std::fs::metadata(&path).unwrap().len() as usize);
    }
    // Dropped without `finish`, as a killed process leaves it: the frame never ends.
    drop(writer);
    let whole = std::fs::read(&path).unwrap();
    let cut_path = dir.path().join("cut.jsonl.zst");
    for cut in (0..=whole.len()).step_by(7) {
        std::fs::write(&cut_path, &whole[..cut]).unwrap();
        let kept = flushed_at.iter().filter(|&&end| end <= cut).count();
        let Ok(mut reader) = JournalReader::open(&cut_path) else {
            panic!("cut at {cut}: cannot open");
        };
        let mut finished_entries = 0;
        while let Some(entry) = reader.next_entry().unwrap() {
            if matches!(entry, JournalEntry::RunFinished(_)) {
                finished_entries += 1;
            }
        }
        assert!(
            finished_entries >= kept,
            "cut at {cut} of {}: {finished_entries} entries read, {kept} were flushed",
            whole.len()
        );
    }
}

#[test]
fn a_plain_journal_of_an_earlier_version_reads_with_its_torn_last_line_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(trellis_journal::PLAIN_FILE);
    let mut file = std::fs::File::create(&path).unwrap();
    for i in 0..3 {
        writeln!(file, "{}", serde_json::to_string(&finished(i)).unwrap()).unwrap();
    }
    writeln!(file).unwrap();
    write!(file, "{{\"node\":{{\"suite\":\"s\",\"sce").unwrap();
    drop(file);
    assert_eq!(trellis_journal::find(dir.path()), Some(path.clone()));
    let (lines, reader) = read_all(&path);
    assert_eq!(lines.len(), 3);
    assert_eq!(reader.skipped(), 1);
    assert!(reader.cut_short());
}

#[test]
fn a_directory_without_a_journal_names_the_file_a_run_writes() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(trellis_journal::find(dir.path()), None);
    let path = trellis_journal::path_in(dir.path());
    assert_eq!(path, dir.path().join(trellis_journal::FILE));
    let error = JournalReader::open(&path).err().unwrap();
    assert!(error.to_string().contains("journal.jsonl.zst"), "{error}");
}

/// An entry far larger than the writer's pieces (an agent's huge answer, with text that
/// needs escaping across the pieces' edges) comes back as written, between small ones.
#[test]
fn a_huge_entry_written_in_pieces_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = JournalWriter::create(dir.path()).unwrap();
    let reply = "line \"quoted\"\n\tünïcødé ✓ \\ ".repeat(40_000);
    let huge = JournalEntry::Node(NodeRecord {
        turns: vec![std::sync::Arc::new(trellis_records::TurnRecord {
            reply: Some(reply),
            ..Default::default()
        })],
        ..match node(7) {
            JournalEntry::Node(n) => n,
            _ => unreachable!(),
        }
    });
    // A plain answer of 200 KB: serde hands it over in one write, larger than a piece.
    let plain = JournalEntry::Node(NodeRecord {
        turns: vec![std::sync::Arc::new(trellis_records::TurnRecord {
            reply: Some("x".repeat(200_000)),
            ..Default::default()
        })],
        ..match node(8) {
            JournalEntry::Node(n) => n,
            _ => unreachable!(),
        }
    });
    let entries = [node(1), huge, plain, finished(2)];
    for entry in &entries {
        writer.append(entry).unwrap();
    }
    let path = writer.finish().unwrap();
    let (lines, reader) = read_all(&path);
    let written: Vec<String> = entries
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    assert_eq!(lines, written);
    assert_eq!(reader.skipped(), 0);
}
