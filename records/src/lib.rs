//! Run records: the stored schema of a Trellis run, one self-contained JSON line per
//! finished unit in the run journal (`journal.jsonl.zst`, written and read by
//! `trellis-journal`).
//!
//! Records are the hand-off between the engine and everything that presents results. The
//! engine (`trellis-engine`, which re-exports this crate as `trellis_engine::record`)
//! appends them to the run journal as soon as each execution node or trajectory finishes,
//! so memory stays bounded and a crash keeps every finished trajectory; `trellis-reports`
//! reads the journal back into tables depending on this crate alone, without the engine's
//! runtime, HTTP stack or agent servers.
//!
//! This crate depends on nothing of Trellis and holds only data: the serde shapes here are
//! the on-disk format (`docs/results.md`), so a change to a field's name or encoding is a
//! change of every journal already written. `tests/previous_journal.rs` decodes a journal
//! written before the types moved here and checks they encode it to the same JSON.

mod chat;
mod fault;
mod journal;
mod llm;
mod shard;
pub mod shown;
mod span;
mod trajectory;
mod turn;

pub use chat::{ChatMessage, ToolCall, ToolCallFunction};
pub use fault::{Fault, FaultCategory, RateLimited};
pub use journal::{
    AbandonedCall, AgentRecord, InstanceInfo, JournalEntry, NodeKey, NodeRecord, RunInfo,
    RunSummary, ScenarioInfo,
};
pub use llm::{CacheUse, JudgeVerdict, LlmCall, LlmUsage, MetricScore};
pub use shard::{SHARD_PLAN_FILE, SHARD_PLAN_VERSION, ShardBalance, ShardPlan, ShardedScenario};
pub use span::{SpanBatch, SpanRecord};
pub use trajectory::{
    AgentBranchRecord, AttackRecord, CUT_BY_BUDGET, CUT_BY_STOP, CUT_MID_WALK, CriterionRecord,
    CriterionStatus, FIDELITY_KIND, TrajectoryRecord, TrajectoryStatus, stopped_at,
    stopped_at_detail,
};
pub use turn::{AttemptRecord, ExchangeRecord, ToolCallRecord, TurnRecord, UserSource};

/// The journal's file name in a run directory: JSON lines in one zstd stream (written and
/// read by `trellis-journal`).
pub const JOURNAL_FILE: &str = "journal.jsonl.zst";
/// The journal's name before journals were compressed: plain JSON lines, still read.
pub const PLAIN_JOURNAL_FILE: &str = "journal.jsonl";
