//! Every Parquet table read back with polars: rows, columns, types, nulls and the one-join
//! transcript.

use std::fs::File;
use std::path::Path;

use polars_core::prelude::*;
use polars_io::prelude::*;
use polars_ops::prelude::*;
use trellis_records::JournalEntry;
use trellis_reports::{ReportOptions, write_reports};

use super::fixtures::{XSS, write_complete_journal};

fn read(path: &Path) -> DataFrame {
    ParquetReader::new(File::open(path).unwrap())
        .finish()
        .unwrap()
}

fn columns(df: &DataFrame) -> Vec<String> {
    df.get_column_names()
        .iter()
        .map(|c| c.to_string())
        .collect()
}

fn dtype(df: &DataFrame, name: &str) -> DataType {
    df.column(name).unwrap().dtype().clone()
}

fn list_str() -> DataType {
    DataType::List(Box::new(DataType::String))
}

/// Small batches force several row groups per file, exercising the batched writer.
fn small_batches() -> ReportOptions {
    ReportOptions {
        batch_rows: 2,
        ..ReportOptions::default()
    }
}

#[test]
fn tables_have_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let files = write_reports(dir.path(), &small_batches()).unwrap();
    assert!(files.complete);
    assert_eq!(files.skipped_lines, 0);
    for path in files.paths() {
        assert!(path.starts_with(dir.path()), "{}", path.display());
        assert!(
            std::fs::metadata(path).unwrap().len() > 0,
            "{}",
            path.display()
        );
    }

    let t = read(&files.trajectories);
    assert_eq!(t.height(), 6);
    assert_eq!(
        columns(&t),
        [
            "run_id",
            "schema_version",
            "suite",
            "scenario",
            "trajectory",
            "agent",
            "protocol",
            "repetition",
            "status",
            "passed",
            "turns",
            "duration_ms",
            "fault_category",
            "fault_message",
            "skip_reason",
            "nodes",
            "tags",
            "criteria_failed",
            "checks_passed",
            "checks_failed",
            "checks_skipped",
            "agent_branches",
            "awaiting_human",
            "sandbox_state",
            "llm_calls",
            "llm_input_tokens",
            "llm_output_tokens",
            "llm_cost",
            "llm_cache_hits",
            "instance_of",
            "dataset",
            "row_id",
            "row",
            "matrix",
            "attack",
        ]
    );
    assert_eq!(dtype(&t, "repetition"), DataType::UInt32);
    assert_eq!(dtype(&t, "passed"), DataType::Boolean);
    assert_eq!(dtype(&t, "turns"), DataType::UInt32);
    assert_eq!(dtype(&t, "duration_ms"), DataType::Float64);
    assert_eq!(dtype(&t, "nodes"), list_str());
    assert_eq!(dtype(&t, "tags"), list_str());
    assert_eq!(dtype(&t, "criteria_failed"), DataType::UInt32);
    for column in ["checks_passed", "checks_failed", "checks_skipped"] {
        assert_eq!(dtype(&t, column), DataType::UInt32);
    }
    // Every check of a trajectory is counted once, by status, as in criteria.parquet.
    let sum = |column: &str| -> u32 {
        t.column(column)
            .unwrap()
            .u32()
            .unwrap()
            .iter()
            .flatten()
            .sum()
    };
    let k = read(&files.criteria);
    let with_status = |status: &str| {
        k.column("status")
            .unwrap()
            .str()
            .unwrap()
            .iter()
            .filter(|s| *s == Some(status))
            .count() as u32
    };
    assert_eq!(sum("checks_failed"), sum("criteria_failed"));
    for status in ["passed", "failed", "skipped"] {
        assert_eq!(
            sum(&format!("checks_{status}")),
            with_status(status),
            "{status}"
        );
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".partial")),
        "every file was moved into place"
    );
    assert_eq!(t.column("fault_category").unwrap().null_count(), 5);
    assert_eq!(t.column("skip_reason").unwrap().null_count(), 5);
    let statuses: Vec<_> = t
        .column("status")
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .flatten()
        .collect();
    assert_eq!(
        statuses,
        ["passed", "passed", "passed", "failed", "error", "skipped"]
    );
    let failed: Vec<_> = t
        .column("criteria_failed")
        .unwrap()
        .u32()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(failed, [0, 0, 0, 1, 0, 0]);
    let passed = t.column("passed").unwrap().bool().unwrap();
    assert_eq!(passed.sum(), Some(3));

    let u = read(&files.turns);
    assert_eq!(u.height(), 13);
    for name in [
        "run_id",
        "schema_version",
        "suite",
        "scenario",
        "node",
        "agent",
        "repetition",
        "turn_index",
        "user_message",
        "reply",
        "latency_ms",
        "ttft_ms",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "model",
        "provider",
        "attempts",
        "tool_calls",
        "started_ms",
        "ended_ms",
        "fault_category",
        "fault_message",
        "kind",
        "function",
        "replay",
        "exchanges",
        "simulator_calls",
        "simulator_input_tokens",
        "simulator_output_tokens",
        "simulator_cost",
        "simulator_cache_hit",
    ] {
        assert!(
            columns(&u).iter().any(|c| c == name),
            "turns.{name} missing"
        );
    }
    assert_eq!(dtype(&u, "replay"), DataType::Boolean);
    assert_eq!(u.column("replay").unwrap().bool().unwrap().sum(), Some(0));
    assert_eq!(u.column("function").unwrap().null_count(), 13);
    assert!(
        u.column("kind")
            .unwrap()
            .str()
            .unwrap()
            .iter()
            .all(|k| k == Some("user"))
    );
    for exchanges in u.column("exchanges").unwrap().str().unwrap().iter() {
        let parsed: serde_json::Value = serde_json::from_str(exchanges.unwrap()).unwrap();
        assert!(parsed.is_array());
    }
    assert_eq!(dtype(&u, "turn_index"), DataType::UInt32);
    assert_eq!(dtype(&u, "total_tokens"), DataType::UInt64);
    assert_eq!(dtype(&u, "ttft_ms"), DataType::Float64);
    assert_eq!(dtype(&u, "tool_calls"), DataType::UInt32);
    assert_eq!(u.column("ttft_ms").unwrap().null_count(), 13);
    assert_eq!(
        u.column("reply").unwrap().null_count(),
        1,
        "the faulted turn has no reply"
    );
    assert_eq!(u.column("fault_category").unwrap().null_count(), 12);
    let calls: u32 = u
        .column("tool_calls")
        .unwrap()
        .u32()
        .unwrap()
        .sum()
        .unwrap();
    assert_eq!(calls, 4);

    let c = read(&files.tool_calls);
    assert_eq!(c.height(), 4);
    assert_eq!(
        columns(&c),
        [
            "run_id",
            "schema_version",
            "suite",
            "scenario",
            "node",
            "agent",
            "repetition",
            "turn_index",
            "call_index",
            "call_id",
            "name",
            "arguments",
            "result",
            "replay",
        ]
    );
    let index: Vec<_> = c
        .column("call_index")
        .unwrap()
        .u32()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(index, [0, 1, 0, 1]);
    assert_eq!(c.column("result").unwrap().null_count(), 2);

    let k = read(&files.criteria);
    assert_eq!(k.height(), 9);
    assert_eq!(
        columns(&k),
        [
            "run_id",
            "schema_version",
            "suite",
            "scenario",
            "trajectory",
            "agent",
            "repetition",
            "turn_index",
            "criterion",
            "kind",
            "status",
            "passed",
            "detail",
            "judge",
            "judge_provider",
            "judge_model",
            "rubric",
            "score",
            "threshold",
            "label",
            "justification",
            "judge_input_tokens",
            "judge_output_tokens",
            "judge_cost",
            "judge_cache_hit",
            "consensus",
            "agreement",
            "judge_error_category",
        ]
    );
    assert_eq!(dtype(&k, "turn_index"), DataType::UInt32);
    assert_eq!(
        k.column("turn_index").unwrap().null_count(),
        4,
        "trajectory-level criteria have no turn"
    );
    let failed = k.column("passed").unwrap().bool().unwrap();
    assert_eq!(failed.sum(), Some(8));

    let r = read(&files.runs);
    assert_eq!(r.height(), 1);
    for name in [
        "run_id",
        "schema_version",
        "started_at",
        "finished_at",
        "trellis_version",
        "duration_ms",
        "trajectories",
        "passed",
        "failed",
        "errors",
        "skipped",
        "turns",
        "planned_trajectories",
        "suites",
        "suite_fingerprint",
        "git_commit",
        "git_dirty",
        "endpoints",
        "tags",
        "labels",
        "rejudged_from",
        "kind",
        "strict",
    ] {
        assert!(columns(&r).iter().any(|c| c == name), "runs.{name} missing");
    }
    // Without run.json the metadata columns are null or empty, never missing.
    assert_eq!(r.column("git_commit").unwrap().null_count(), 1);
    let versions = t.column("schema_version").unwrap().u32().unwrap();
    assert!(
        versions
            .into_no_null_iter()
            .all(|v| v == trellis_reports::history::SCHEMA_VERSION)
    );
    let count = |name: &str| r.column(name).unwrap().u64().unwrap().get(0).unwrap();
    assert_eq!(
        [
            count("trajectories"),
            count("passed"),
            count("failed"),
            count("errors"),
            count("skipped"),
            count("turns")
        ],
        [6, 3, 1, 1, 1, 13]
    );
    assert_eq!(r.column("finished_at").unwrap().null_count(), 0);
    assert_eq!(dtype(&r, "suites"), list_str());
}

#[test]
fn one_join_gives_each_trajectory_its_turns_in_order() {
    let dir = tempfile::tempdir().unwrap();
    write_complete_journal(dir.path());
    let files = write_reports(dir.path(), &small_batches()).unwrap();
    let trajectories = read(&files.trajectories);
    let turns = read(&files.turns);

    let mut exploded = trajectories
        .select([
            "run_id",
            "suite",
            "scenario",
            "trajectory",
            "agent",
            "repetition",
            "nodes",
        ])
        .unwrap()
        .explode(
            ["nodes"],
            ExplodeOptions {
                empty_as_null: true,
                keep_nulls: true,
            },
        )
        .unwrap();
    exploded.rename("nodes", "node".into()).unwrap();
    let keys = ["run_id", "suite", "scenario", "agent", "repetition", "node"];
    let joined = exploded
        .join(&turns, keys, keys, JoinArgs::new(JoinType::Inner), None)
        .unwrap()
        .sort(
            ["scenario", "trajectory", "repetition", "turn_index"],
            SortMultipleOptions::default(),
        )
        .unwrap();
    // Four booking trajectories of four turns each, plus the faulted ping turn; the skipped
    // trajectory has no node and no turn.
    assert_eq!(joined.height(), 17);

    let mask = joined
        .column("trajectory")
        .unwrap()
        .str()
        .unwrap()
        .equal("asks-price")
        & joined.column("repetition").unwrap().u32().unwrap().equal(1);
    let one = joined.filter(&mask).unwrap();
    let index: Vec<_> = one
        .column("turn_index")
        .unwrap()
        .u32()
        .unwrap()
        .into_no_null_iter()
        .collect();
    assert_eq!(index, [0, 1, 2, 3]);
    let nodes: Vec<_> = one
        .column("node")
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .flatten()
        .collect();
    assert_eq!(nodes, ["start", "start", "asks-price", "asks-price/then"]);
    let replies: Vec<_> = one.column("reply").unwrap().str().unwrap().iter().collect();
    assert_eq!(replies[2], Some(XSS));
}

#[test]
fn empty_tables_are_valid_files() {
    let dir = tempfile::tempdir().unwrap();
    super::fixtures::write_journal(
        dir.path(),
        &[trellis_records::JournalEntry::RunStarted(
            std::sync::Arc::new(super::fixtures::run_info()),
        )],
        "",
    );
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    assert!(!files.complete);
    let t = read(&files.trajectories);
    assert_eq!(t.height(), 0);
    assert_eq!(dtype(&t, "nodes"), list_str());
    assert_eq!(read(&files.tool_calls).height(), 0);
    assert_eq!(read(&files.runs).height(), 1);
}

/// Which column chunks of `path` are dictionary-encoded, by column path.
fn dictionary_columns(path: &Path) -> Vec<String> {
    let metadata =
        polars_parquet::parquet::read::read_metadata(&mut File::open(path).unwrap()).unwrap();
    metadata
        .row_groups
        .iter()
        .flat_map(|group| group.parquet_columns())
        .filter(|column| column.dictionary_page_offset().is_some())
        .map(|column| column.descriptor().path_in_schema.join("."))
        .collect()
}

/// A text column chunk holding a huge value (an agent's 100 KB answer) is written without
/// its minimum and maximum, which polars would copy whole first; the others keep theirs,
/// and the value reads back whole.
#[test]
fn a_huge_answer_has_no_min_max_statistics_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let huge = "x".repeat(100 * 1024);
    let mut entries = super::fixtures::entries();
    let node = entries
        .iter_mut()
        .find_map(|e| match e {
            JournalEntry::Node(n) if !n.turns.is_empty() => Some(n),
            _ => None,
        })
        .unwrap();
    std::sync::Arc::make_mut(&mut node.turns[0]).reply = Some(huge.clone());
    entries.push(JournalEntry::RunFinished(super::fixtures::summary()));
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    let metadata =
        polars_parquet::parquet::read::read_metadata(&mut File::open(&files.turns).unwrap())
            .unwrap();
    let min_max = |name: &str| {
        let column = metadata
            .row_groups
            .iter()
            .flat_map(|group| group.parquet_columns())
            .find(|column| column.descriptor().path_in_schema.join(".") == name)
            .unwrap();
        match column.statistics(&metadata.footer_buf) {
            Some(Ok(polars_parquet::parquet::statistics::Statistics::Binary(s))) => {
                (s.min_value.is_some(), s.max_value.is_some())
            }
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(min_max("reply"), (false, false));
    assert_eq!(min_max("user_message"), (true, true));
    let turns = read(&files.turns);
    let replies = turns.column("reply").unwrap().str().unwrap();
    assert!(replies.iter().any(|r| r == Some(huge.as_str())));
}

/// A batch of a few rows is written plainly (polars' dictionary attempt costs about as
/// much per column as writing it); a larger one keeps dictionaries where they pay. Both
/// read back the same.
#[test]
fn small_batches_are_written_plainly_and_large_ones_with_dictionaries() {
    let small = tempfile::tempdir().unwrap();
    write_complete_journal(small.path());
    let files = write_reports(small.path(), &ReportOptions::default()).unwrap();
    assert_eq!(
        dictionary_columns(&files.trajectories),
        Vec::<String>::new()
    );
    assert_eq!(read(&files.trajectories).height(), 6);

    let large = tempfile::tempdir().unwrap();
    let entries = fixture_with_repeated_trajectories(40);
    super::fixtures::write_journal(large.path(), &entries, "");
    let files = write_reports(large.path(), &ReportOptions::default()).unwrap();
    let trajectories = read(&files.trajectories);
    assert_eq!(trajectories.height(), 246);
    assert!(dictionary_columns(&files.trajectories).contains(&"suite".to_string()));
    assert_eq!(
        trajectories
            .column("suite")
            .unwrap()
            .str()
            .unwrap()
            .iter()
            .filter(|s| *s == Some("shop"))
            .count(),
        164
    );
}

/// Many rows at the end, the tables ended by two threads (`TablesEnd::help`, the pages'
/// thread taking what is left once the pages are written): every table still holds every
/// row.
#[test]
fn tables_written_side_by_side_keep_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let entries = fixture_with_repeated_trajectories(150);
    let criteria: usize = entries
        .iter()
        .map(|e| match e {
            JournalEntry::Trajectory(t) => t.criteria.len(),
            _ => 0,
        })
        .sum();
    assert!(criteria >= 512, "{criteria} criteria rows");
    super::fixtures::write_journal(dir.path(), &entries, "");
    let files = write_reports(dir.path(), &ReportOptions::default()).unwrap();
    assert!(files.not_written.is_empty(), "{:?}", files.not_written);
    assert_eq!(read(&files.trajectories).height(), 906);
    assert_eq!(read(&files.criteria).height(), criteria);
    let small = tempfile::tempdir().unwrap();
    write_complete_journal(small.path());
    let small = write_reports(small.path(), &ReportOptions::default()).unwrap();
    assert_eq!(
        read(&files.turns).height(),
        read(&small.turns).height(),
        "the turns come from the nodes, which were not repeated"
    );
}

/// The fixture's journal with its trajectories recorded again `rounds` times, each round
/// under repetitions of its own.
fn fixture_with_repeated_trajectories(rounds: u32) -> Vec<JournalEntry> {
    let mut entries = super::fixtures::entries();
    let trajectories: Vec<JournalEntry> = entries
        .iter()
        .filter(|e| matches!(e, JournalEntry::Trajectory(_)))
        .cloned()
        .collect();
    for round in 1..=rounds {
        for entry in &trajectories {
            if let JournalEntry::Trajectory(t) = entry {
                let mut t = t.clone();
                t.repetition += 10 * round;
                entries.push(JournalEntry::Trajectory(t));
            }
        }
    }
    entries
}
