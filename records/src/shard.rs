//! `shard.json`: how `trellis run --shard I/N` split the whole plan, written into every
//! shard's run directory before its engine starts.
//!
//! Each shard writes the whole split, not only its own part: `trellis merge` reads it to
//! know what the run as a whole was meant to hold, so it can say which scenarios and
//! trajectories are missing when a shard's directory is missing or its run did not finish,
//! and give the merged run the plan an unsharded run would have started with.

use serde::{Deserialize, Serialize};

use crate::journal::ScenarioInfo;

/// The split's file name in a shard's run directory.
pub const SHARD_PLAN_FILE: &str = "shard.json";

/// The version of [`ShardPlan`]'s layout; raised when a field changes meaning.
pub const SHARD_PLAN_VERSION: u32 = 1;

/// The whole plan of a sharded run, and which shard runs what.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardPlan {
    pub version: u32,
    /// This directory's shard, 1 to `count`.
    pub index: u32,
    /// How many shards the plan was split into.
    pub count: u32,
    /// What the split was balanced by.
    pub balance: ShardBalance,
    /// BLAKE3 of the split (the shard count and every scenario's suite, id and shard, in
    /// plan order): shards agree on the split exactly when their digests are equal.
    pub digest: String,
    /// Every scenario of the whole plan, in plan order, with its shard.
    pub scenarios: Vec<ShardedScenario>,
}

/// What a split was balanced by.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum ShardBalance {
    /// Each scenario's trajectory runs (trajectories × agents × repetitions).
    Trajectories,
    /// Each scenario's summed agent turn latency in an earlier whole run (`run_id`);
    /// scenarios that run did not have are estimated from their trajectory runs.
    MeasuredCost { run_id: String },
}

/// One scenario of a sharded plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardedScenario {
    /// The shard that runs it, 1 to [`ShardPlan::count`].
    pub shard: u32,
    /// The cost it was balanced by, in the unit of [`ShardPlan::balance`]: trajectory runs,
    /// or microseconds of agent turns.
    pub cost: u64,
    /// The scenario as the run's `run_started` entry describes it.
    pub info: ScenarioInfo,
}
