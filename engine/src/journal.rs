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
