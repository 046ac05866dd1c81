//! `trellis run --replay-users RUN`: the simulated user's messages of a recorded run, sent
//! to the agent again instead of being written by the simulator, for as long as the agent
//! answers as it did in the recording.
//!
//! This is how `trellis variance` holds the user fixed while the agent varies: the agent
//! sees the same user, so what changes between repetitions is the agent's own doing (and
//! the judge's). Once the agent's answer *diverges* from the recorded one, the recorded
//! user's next message answers a conversation that did not happen; from there on the path's
//! simulated turns are written fresh, and each simulated turn is marked with where its
//! message came from ([`UserSource`]).
//!
//! **Divergence**: at a simulated turn *i*, a recorded trajectory (of the same suite,
//! scenario and agent) matches when every turn before *i* is the same in both: the same
//! user message, the same reply after [`normalise`] (lower case, words only, so spacing
//! and punctuation do not count), and the same tool calls (names and arguments as JSON
//! values, in order). The recorded turn *i* is then replayed when it was simulated; when
//! it was a scripted turn, or the recording has no turn *i* and ended normally, the
//! recorded user had stopped there and so does the replayed one. No match (the agent said
//! something else, or the recording ended in a fault or with the user breaking character)
//! means a fresh message.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::record::{JournalEntry, NodeKey, NodeRecord, TrajectoryStatus, TurnRecord, UserSource};

/// The recorded conversations of one run, ready to replay their simulated users.
#[derive(Debug, Default)]
pub struct UserReplay {
    /// The recorded run's id (for messages).
    run_id: String,
    /// Per (suite, scenario, agent): every recorded trajectory, lowest repetition first.
    paths: HashMap<(String, String, String), Vec<RecordedPath>>,
    /// Replay this recorded repetition for every repetition of the new run (`trellis
    /// variance`: every repetition sees the same user); `None` replays repetition *r* for
    /// repetition *r*, and the lowest recorded one where the recording has no *r*.
    pin: Option<u32>,
}

#[derive(Debug)]
struct RecordedPath {
    repetition: u32,
    /// The conversation by turn index (a turn replayed at a fork replaces the earlier one
    /// of the same index, as in the run).
    turns: BTreeMap<u32, Arc<TurnRecord>>,
    /// Ended as the conversation meant to (passed or failed): a missing turn after the
    /// last one means the user stopped there, not that the run was cut short.
    ended_cleanly: bool,
}

/// What the simulated user says at a turn of a `--replay-users` run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replayed {
    /// The recorded message.
    Message(String),
    /// The recorded user stopped here (the simulate step ends).
    End,
    /// No recorded conversation matches the one so far: write a fresh message.
    Fresh,
}

impl UserReplay {
    /// Reads a run's journal entries.
    pub fn from_entries(entries: impl IntoIterator<Item = JournalEntry>) -> Self {
        let mut run_id = String::new();
        let mut nodes: HashMap<NodeKey, Arc<NodeRecord>> = HashMap::new();
        let mut paths: HashMap<(String, String, String), Vec<RecordedPath>> = HashMap::new();
        for entry in entries {
            match entry {
                JournalEntry::RunStarted(info) => run_id = info.run_id.clone(),
                JournalEntry::Node(n) => {
                    nodes.insert(n.key(), Arc::new(n));
                }
                JournalEntry::Trajectory(t) => {
                    let mut turns = BTreeMap::new();
                    for node in &t.nodes {
                        let key = t.node_key(node);
                        if let Some(n) = nodes.get(&key) {
                            for turn in &n.turns {
                                turns.insert(turn.turn_index, turn.clone());
                            }
                        }
                    }
                    let ended_cleanly = t.fault.is_none()
                        && matches!(
                            t.status,
                            TrajectoryStatus::Passed | TrajectoryStatus::Failed
                        );
                    paths
                        .entry((t.suite.clone(), t.scenario.clone(), t.agent.clone()))
                        .or_default()
                        .push(RecordedPath {
                            repetition: t.repetition,
                            turns,
                            ended_cleanly,
                        });
                }
                JournalEntry::Agent(_) | JournalEntry::Spans(_) | JournalEntry::RunFinished(_) => {}
            }
        }
        for list in paths.values_mut() {
            list.sort_by_key(|p| p.repetition);
        }
        UserReplay {
            run_id,
            paths,
            pin: None,
        }
    }

    /// Every repetition of the new run replays the recorded repetition `repetition` (else
    /// the lowest recorded one).
    pub fn pin(mut self, repetition: u32) -> Self {
        self.pin = Some(repetition);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Recorded trajectories.
    pub fn len(&self) -> usize {
        self.paths.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether any recorded turn was written by the simulator.
    pub fn has_simulated_turns(&self) -> bool {
        self.paths
            .values()
            .flatten()
            .any(|p| p.turns.values().any(|t| is_simulated(t)))
    }

    /// What the user says at the next simulated turn of repetition `repetition` of
    /// (`suite`, `scenario`, `agent`), after the turns `so_far` of this path.
    pub fn next<T: AsRef<TurnRecord>>(
        &self,
        (suite, scenario, agent): (&str, &str, &str),
        repetition: u32,
        so_far: &[T],
    ) -> Replayed {
        let Some(list) = self
            .paths
            .get(&(suite.to_owned(), scenario.to_owned(), agent.to_owned()))
        else {
            return Replayed::Fresh;
        };
        let wanted = self.pin.unwrap_or(repetition);
        let chosen = if list.iter().any(|p| p.repetition == wanted) {
            wanted
        } else {
            match list.first() {
                Some(p) => p.repetition,
                None => return Replayed::Fresh,
            }
        };
        let mut live: BTreeMap<u32, &TurnRecord> = BTreeMap::new();
        for turn in so_far {
            let turn = turn.as_ref();
            live.insert(turn.turn_index, turn);
        }
        let next = live.keys().next_back().map_or(0, |i| i.saturating_add(1));
        for path in list.iter().filter(|p| p.repetition == chosen) {
            let before: Vec<&TurnRecord> = path.turns.range(..next).map(|(_, t)| &**t).collect();
            if before.len() != live.len()
                || !before
                    .iter()
                    .zip(live.values())
                    .all(|(r, l)| same_turn(r, l))
            {
                continue;
            }
            return match path.turns.get(&next) {
                Some(turn) if is_simulated(turn) => Replayed::Message(turn.user_message.clone()),
                Some(_) => Replayed::End,
                None if path.ended_cleanly => Replayed::End,
                None => Replayed::Fresh,
            };
        }
        Replayed::Fresh
    }
}

/// A turn whose user message the simulator wrote (or a replay of one).
pub fn is_simulated(turn: &TurnRecord) -> bool {
    turn.kind == "user"
        && !turn.replay
        && (!turn.simulator.is_empty() || turn.user_source.is_some())
}

/// Whether a live turn is the recorded one: the same input, the same reply up to
/// [`normalise`], the same tool calls.
fn same_turn(recorded: &TurnRecord, live: &TurnRecord) -> bool {
    recorded.turn_index == live.turn_index
        && recorded.kind == live.kind
        && recorded.user_message == live.user_message
        && normalise(recorded.reply.as_deref().unwrap_or(""))
            == normalise(live.reply.as_deref().unwrap_or(""))
        && recorded.tool_calls.len() == live.tool_calls.len()
        && recorded
            .tool_calls
            .iter()
            .zip(&live.tool_calls)
            .all(|(a, b)| a.name == b.name && same_json(&a.arguments, &b.arguments))
}

/// Arguments compared as JSON values (key order and spacing do not count), as text when
/// either is not JSON.
fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.trim() == b.trim(),
    }
}

/// A reply as compared for divergence: lower-case words (letters and digits), single
/// spaces.
pub fn normalise(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The source a turn of a replaying run records.
pub(super) fn source_of(replayed: &Replayed) -> UserSource {
    match replayed {
        Replayed::Message(_) => UserSource::Recorded,
        Replayed::End | Replayed::Fresh => UserSource::Fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_differing_in_case_and_punctuation_do_not_diverge() {
        assert_eq!(normalise("Booked!  See you,  Bob."), "booked see you bob");
        assert_ne!(normalise("Booked."), normalise("Not booked."));
    }
}
