//! The run journal: one [`JournalEntry`](crate::record::JournalEntry) per line in one zstd
//! stream (`journal.jsonl.zst`), appended as events arrive and flushed after every finished
//! trajectory or batch of them, so a crash loses at most the trajectories still in flight
//! or queued for the recorder. The file format
//! lives in `trellis-journal`, shared with the reports, which read journals without the
//! engine.

pub use trellis_journal::{
    FILE as JOURNAL_FILE, JournalError, JournalReader, JournalWriter, PLAIN_FILE, find,
    is_node_line, parse_line, path_in, read,
};

/// A journal's time (`started_at`, `finished_at`): RFC 3339, UTC, to the millisecond. Runs
/// started within one second are ordered by it, and a trace's spans are placed from it
/// (docs/results.md, `started_at`).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
