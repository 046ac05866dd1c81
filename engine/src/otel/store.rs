//! What the receiver has taken in, resolved to turns.
//!
//! A span belongs to the turn whose span is its nearest ancestor among the run's turn spans.
//! Spans can arrive in any order (children usually end, and are exported, before their
//! parent), so a span whose parent has not been seen yet waits in `orphans` until it has.
//! Memory is bounded by [`MAX_SPANS`]: beyond it new spans are counted and dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::record::{SpanBatch, SpanRecord};

/// Spans held at once (on turns not yet taken, or waiting for a parent).
pub const MAX_SPANS: usize = 200_000;

/// Which turn a late batch belongs to, as its node record names it.
#[derive(Clone, Debug, Default)]
pub struct TurnKey {
    pub suite: String,
    pub scenario: String,
    pub agent: String,
    pub repetition: u32,
    pub node: String,
    pub turn_index: u32,
}

#[derive(Default)]
struct State {
    /// The run's trace, as 32 hex digits: spans of other traces are not ours.
    trace_id: String,
    /// Every turn span of the run (hex), with its key once its node was recorded.
    turns: HashMap<String, Option<TurnKey>>,
    /// Span id → the turn span it belongs to, for every span resolved so far.
    owner: HashMap<String, String>,
    /// Spans resolved to a turn and not yet taken, by turn span.
    by_turn: HashMap<String, Vec<SpanRecord>>,
    /// Turns whose own root span (parent = the turn span) has arrived.
    rooted: HashSet<String>,
    /// Turns whose agent was not told where to send spans: their spans are taken if they
    /// come, but the end of the run does not wait for them ([`SpanStore::expect_turn`]).
    unawaited: HashSet<String>,
    /// Spans whose parent has not been seen, by parent span id.
    orphans: HashMap<String, Vec<SpanRecord>>,
    held: usize,
    dropped_full: u64,
    foreign: u64,
    received: u64,
    /// Export requests the receiver refused (a body it cannot read), with the last one's
    /// reason.
    refused: u64,
    refusal: Option<String>,
}

/// The spans the receiver took in, for one run.
pub struct SpanStore {
    state: Mutex<State>,
    arrived: Notify,
}

/// What the store saw over the run, for the console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub received: u64,
    /// Of another trace than the run's.
    pub foreign: u64,
    /// Dropped because [`MAX_SPANS`] were held.
    pub dropped: u64,
    /// Never matched to a turn (no ancestor among the run's turns arrived).
    pub unmatched: u64,
}

impl SpanStore {
    /// A store taking spans of trace `trace_id` (32 hex digits).
    pub fn new(trace_id: String) -> Self {
        SpanStore {
            state: Mutex::new(State {
                trace_id,
                ..State::default()
            }),
            arrived: Notify::new(),
        }
    }

    /// Starts over for a run of trace `trace_id`: what an earlier run left is dropped.
    pub fn begin(&self, trace_id: String) {
        *self.lock() = State {
            trace_id,
            ..State::default()
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind: keep using them.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A turn span is about to be sent: spans naming it are this run's. `awaited`: its agent
    /// knows where to send them, so the end of the run waits for its root span
    /// ([`Self::finish`]); an agent that was never told the receiver's address cannot send
    /// any, and waiting for it would hold every run's end for the whole grace period.
    pub fn expect_turn(&self, span_id: &str, awaited: bool) {
        let mut state = self.lock();
        state.turns.insert(span_id.to_owned(), None);
        if !awaited {
            state.unawaited.insert(span_id.to_owned());
        }
    }

    /// A turn whose requests never reached the agent (a connect fault): no span will name
    /// it, so neither the turn nor the end of the run waits for one.
    pub fn forget_turn(&self, span_id: &str) {
        let mut state = self.lock();
        state.turns.remove(span_id);
        state.unawaited.remove(span_id);
    }

    /// The recorded turn behind `span_id`, for the late batches of [`Self::finish`].
    pub fn name_turn(&self, span_id: &str, key: TurnKey) {
        if let Some(slot) = self.lock().turns.get_mut(span_id) {
            *slot = Some(key);
        }
    }

    /// Spans of other traces taken in so far (and dropped): an agent that exports to the
    /// receiver without continuing the `traceparent` it was sent.
    pub fn foreign(&self) -> u64 {
        self.lock().foreign
    }

    /// An export request the receiver refused, and why (as its answer said).
    pub fn refuse(&self, why: &str) {
        let mut state = self.lock();
        state.refused += 1;
        state.refusal = Some(why.to_owned());
    }

    /// Export requests refused so far, with the last one's reason.
    pub fn refused(&self) -> Option<(u64, String)> {
        let state = self.lock();
        state.refusal.clone().map(|why| (state.refused, why))
    }

    /// Takes in spans decoded from one export request.
    pub fn add(&self, spans: Vec<SpanRecord>) {
        {
            let mut state = self.lock();
            for span in spans {
                state.received += 1;
                if span.trace_id != state.trace_id {
                    state.foreign += 1;
                    continue;
                }
                if state.held >= MAX_SPANS {
                    state.dropped_full += 1;
                    continue;
                }
                state.held += 1;
                state.place(span);
            }
        }
        self.arrived.notify_waiters();
    }

    /// Waits up to `wait` for the agent's root span of the turn (the one whose parent is
    /// the turn's span: it ends last, so its children have been exported by then), then
    /// takes every span of the turn that arrived, in start order. `None` when the root did
    /// not arrive in time (what did arrive is still taken).
    pub async fn take_turn(&self, span_id: &str, wait: Duration) -> (Vec<SpanRecord>, bool) {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().rooted.contains(span_id) {
                return (self.take(span_id), true);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return (self.take(span_id), false);
            }
        }
    }

    fn take(&self, span_id: &str) -> Vec<SpanRecord> {
        let mut state = self.lock();
        let mut spans = state.by_turn.remove(span_id).unwrap_or_default();
        state.held = state.held.saturating_sub(spans.len());
        spans.sort_by_key(|s| (s.start_unix_nano, s.end_unix_nano));
        spans
    }

    /// Waits up to `wait` for every awaited turn to have its root span; returns how many
    /// still lack it.
    pub async fn settle(&self, wait: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.missing_roots() == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.missing_roots();
            }
        }
    }

    /// How many awaited turns of the run do not have their agent's root span yet: what
    /// the end of the run waits for ([`Self::settle`]).
    pub fn missing_roots(&self) -> usize {
        let state = self.lock();
        state
            .turns
            .keys()
            .filter(|t| !state.rooted.contains(*t) && !state.unawaited.contains(*t))
            .count()
    }

    /// The end of the run (after [`Self::settle`] waited for late spans): hands out every
    /// span not taken, per turn, and the counts.
    pub fn finish(&self) -> (Vec<SpanBatch>, StoreCounts) {
        let mut state = self.lock();
        let by_turn = std::mem::take(&mut state.by_turn);
        let mut batches = Vec::new();
        let mut unmatched = state.orphans.values().map(Vec::len).sum::<usize>() as u64;
        for (turn, mut spans) in by_turn {
            match state.turns.get(&turn).cloned().flatten() {
                Some(key) => {
                    spans.sort_by_key(|s| (s.start_unix_nano, s.end_unix_nano));
                    batches.push(SpanBatch {
                        suite: key.suite,
                        scenario: key.scenario,
                        agent: key.agent,
                        repetition: key.repetition,
                        node: key.node,
                        turn_index: key.turn_index,
                        spans,
                    });
                }
                // A turn that was never recorded (the run stopped mid-turn).
                None => unmatched += spans.len() as u64,
            }
        }
        batches.sort_by(|a, b| {
            (&a.scenario, &a.agent, a.repetition, &a.node, a.turn_index).cmp(&(
                &b.scenario,
                &b.agent,
                b.repetition,
                &b.node,
                b.turn_index,
            ))
        });
        let counts = StoreCounts {
            received: state.received,
            foreign: state.foreign,
            dropped: state.dropped_full,
            unmatched,
        };
        (batches, counts)
    }
}

impl State {
    /// Puts a span of the run's trace on its turn, or among the orphans until its parent
    /// arrives; then settles any orphans that were waiting for it.
    fn place(&mut self, span: SpanRecord) {
        let mut pending = vec![span];
        while let Some(span) = pending.pop() {
            let owner = match span.parent_span_id.as_deref() {
                Some(parent) if self.turns.contains_key(parent) => {
                    self.rooted.insert(parent.to_owned());
                    Some(parent.to_owned())
                }
                Some(parent) => self.owner.get(parent).cloned(),
                None => None,
            };
            match (owner, span.parent_span_id.clone()) {
                (Some(turn), _) => {
                    self.owner.insert(span.span_id.clone(), turn.clone());
                    if let Some(children) = self.orphans.remove(&span.span_id) {
                        pending.extend(children);
                    }
                    self.by_turn.entry(turn).or_default().push(span);
                }
                (None, Some(parent)) => self.orphans.entry(parent).or_default().push(span),
                // A root span of the run's trace that is not a turn's: nothing to hang
                // it on (the agent started a trace of its own with our trace id).
                (None, None) => {
                    self.held = self.held.saturating_sub(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, start: u64) -> SpanRecord {
        SpanRecord {
            trace_id: "t".into(),
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            name: id.into(),
            start_unix_nano: start,
            end_unix_nano: start + 1,
            ..SpanRecord::default()
        }
    }

    #[tokio::test]
    async fn children_before_their_parent_still_reach_the_turn() {
        let store = SpanStore::new("t".into());
        store.expect_turn("turn", true);
        store.add(vec![span("tool", Some("agent"), 2)]);
        let (spans, rooted) = store.take_turn("turn", Duration::ZERO).await;
        assert!(spans.is_empty() && !rooted);
        store.add(vec![span("agent", Some("turn"), 1)]);
        let (spans, rooted) = store.take_turn("turn", Duration::ZERO).await;
        assert!(rooted);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["agent", "tool"]);
    }

    #[tokio::test]
    async fn the_end_waits_only_for_turns_whose_agent_can_send_spans() {
        let store = SpanStore::new("t".into());
        store.expect_turn("told", true);
        store.expect_turn("untold", false);
        store.add(vec![span("agent", Some("told"), 1)]);
        // An hour's grace: only a turn that is waited for could hold it.
        let finished = tokio::time::timeout(
            Duration::from_secs(30),
            store.settle(Duration::from_secs(3600)),
        )
        .await;
        assert!(
            finished.is_ok(),
            "the end waited for the untold agent's turn"
        );

        let store = SpanStore::new("t".into());
        store.expect_turn("told", true);
        let finished = tokio::time::timeout(
            Duration::from_millis(200),
            store.settle(Duration::from_secs(3600)),
        )
        .await;
        assert!(
            finished.is_err(),
            "a told agent's missing root span is waited for"
        );
    }

    #[tokio::test]
    async fn late_spans_and_other_traces() {
        let store = SpanStore::new("t".into());
        store.expect_turn("turn", true);
        store.name_turn(
            "turn",
            TurnKey {
                scenario: "s".into(),
                ..TurnKey::default()
            },
        );
        let mut other = span("x", Some("turn"), 1);
        other.trace_id = "other".into();
        store.add(vec![other, span("agent", Some("turn"), 1)]);
        let (batches, counts) = store.finish();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].spans.len(), 1);
        assert_eq!(counts.foreign, 1);
        assert_eq!(counts.received, 2);
    }
}
