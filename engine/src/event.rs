//! The execution event stream: the one channel between the runner and every reporter.
//!
//! The executor sends each [`Event`] as it happens (run started, an execution node's turns,
//! a finished trajectory, run finished); reporters — the journal writer, the progress bar,
//! the summary — consume the same stream, so what is shown and what is stored never
//! disagree. Events are the journal's entries: storing an event is writing one line.
//!
//! The stream is bounded twice: by [`EVENT_BUFFER`] events, and by [`EVENT_BYTES`] of the
//! text they carry. A count alone bounds nothing when each event is large: an agent that
//! answers 5 MB per turn had 200 finished nodes (a reply and its message each) queued ahead
//! of a recorder that writes them more slowly than the agent answers, 1.7 GB, where the
//! budget holds the executor back once 128 MiB wait. Each event takes its weight
//! ([`weight`]) from the budget as it is sent and gives it back as the reporter takes it.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};

pub use crate::record::JournalEntry as Event;

/// Capacity of the event channel, in events.
pub const EVENT_BUFFER: usize = 1024;

/// Capacity of the event channel in the text its events carry, in bytes.
pub const EVENT_BYTES: usize = 128 * 1024 * 1024;

/// The unit of the byte budget: an event weighs at least one.
const UNIT: usize = 1024;

/// Budget units in all ([`EVENT_BYTES`] in [`UNIT`]s); an event weighs at most this much.
const UNITS: u32 = (EVENT_BYTES / UNIT) as u32;

struct Weighed {
    event: Event,
    units: u32,
}

/// The sending half the executor holds. Bounded, so a slow reporter applies backpressure
/// instead of letting finished records pile up in memory.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<Weighed>,
    room: Arc<Semaphore>,
}

/// The receiving half: each event taken gives its weight back to the budget.
pub struct EventReceiver {
    rx: mpsc::Receiver<Weighed>,
    room: Arc<Semaphore>,
}

pub fn channel() -> (EventSender, EventReceiver) {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let room = Arc::new(Semaphore::new(UNITS as usize));
    (
        EventSender {
            tx,
            room: room.clone(),
        },
        EventReceiver { rx, room },
    )
}

/// The stream has no receiver any more: the event was not sent.
#[derive(Debug)]
pub struct Closed(pub Event);

/// Room in the stream for one event, taken by [`EventSender::reserve`]: sending with it
/// cannot wait.
pub struct SendPermit<'a> {
    slot: mpsc::Permit<'a, Weighed>,
    /// Given back when the permit is dropped unused; once sent, by the receiver.
    room: tokio::sync::SemaphorePermit<'a>,
}

impl SendPermit<'_> {
    pub fn send(self, event: Event) {
        let units = self.room.num_permits() as u32;
        self.room.forget();
        self.slot.send(Weighed { event, units });
    }
}

impl EventSender {
    /// Sends `event`, waiting while the stream is full (in events or in bytes).
    pub async fn send(&self, event: Event) -> Result<(), Closed> {
        match self.reserve(&event).await {
            Some(permit) => {
                permit.send(event);
                Ok(())
            }
            None => Err(Closed(event)),
        }
    }

    /// Room for `event` (by its weight) and a slot for it, or `None` when the stream has no
    /// receiver. Dropping the permit unused gives the room back.
    pub async fn reserve(&self, event: &Event) -> Option<SendPermit<'_>> {
        let room = self.room.acquire_many(weight(event)).await.ok()?;
        let slot = self.tx.reserve().await.ok()?;
        Some(SendPermit { slot, room })
    }
}

impl Drop for EventReceiver {
    /// A sender waiting for room that will never be given back (the reporter is gone) is
    /// told so, as the channel tells one waiting for a slot.
    fn drop(&mut self) {
        self.room.close();
    }
}

impl EventReceiver {
    fn taken(&self, weighed: Weighed) -> Event {
        self.room.add_permits(weighed.units as usize);
        weighed.event
    }

    pub async fn recv(&mut self) -> Option<Event> {
        let weighed = self.rx.recv().await?;
        Some(self.taken(weighed))
    }

    /// [`Self::recv`] for a thread outside the runtime.
    pub fn blocking_recv(&mut self) -> Option<Event> {
        let weighed = self.rx.blocking_recv()?;
        Some(self.taken(weighed))
    }

    pub fn try_recv(&mut self) -> Result<Event, mpsc::error::TryRecvError> {
        let weighed = self.rx.try_recv()?;
        Ok(self.taken(weighed))
    }
}

/// What an event weighs against [`EVENT_BYTES`], in [`UNIT`]s: the text of its turns
/// (messages sent and answered, tool arguments and results, structured data, the agent's
/// spans), its checks' details, judges' justifications, captures, sandbox state and attack
/// messages, and late spans, which is nearly all of a large event; at least one, at most the
/// whole budget (so one event larger than it still goes, alone).
pub fn weight(event: &Event) -> u32 {
    let bytes = match event {
        Event::Node(node) => node.turns.iter().map(|t| turn_bytes(t)).sum(),
        Event::Trajectory(t) => {
            t.criteria
                .iter()
                .map(|c| {
                    c.detail.as_ref().map_or(0, String::len)
                        + c.judge.as_deref().map_or(0, verdict_bytes)
                })
                .sum::<usize>()
                + t.sandbox_state.as_ref().map_or(0, json_bytes)
                + t.captures.values().map(String::len).sum::<usize>()
                + t.attack
                    .as_ref()
                    .map_or(0, |a| a.messages.iter().map(String::len).sum())
        }
        Event::Spans(batch) => batch.spans.iter().map(span_bytes).sum(),
        _ => 0,
    };
    u32::try_from(bytes / UNIT + 1).map_or(UNITS, |u| u.min(UNITS))
}

fn verdict_bytes(verdict: &trellis_records::JudgeVerdict) -> usize {
    verdict.justification.as_ref().map_or(0, String::len)
        + verdict.members.iter().map(verdict_bytes).sum::<usize>()
}

/// A span's size, about: an instrumented agent's spans may carry every prompt and answer
/// of its model calls in their attributes (OpenInference's `input.value`), far more than
/// its reply.
fn span_bytes(span: &trellis_records::SpanRecord) -> usize {
    span.name.len()
        + span.status_message.as_ref().map_or(0, String::len)
        + span
            .attributes
            .iter()
            .map(|(k, v)| k.len() + json_bytes(v))
            .sum::<usize>()
}

/// A JSON value's size, about, without writing it out.
fn json_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => items.iter().map(|v| json_bytes(v) + 1).sum::<usize>() + 2,
        Value::Object(map) => {
            map.iter()
                .map(|(k, v)| k.len() + 4 + json_bytes(v))
                .sum::<usize>()
                + 2
        }
        _ => 8,
    }
}

fn turn_bytes(turn: &crate::record::TurnRecord) -> usize {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    turn.user_message.len()
        + text(&turn.reply)
        + turn
            .messages
            .iter()
            .map(|m| {
                text(&m.content)
                    + m.tool_calls
                        .iter()
                        .map(|c| c.function.arguments.len())
                        .sum::<usize>()
            })
            .sum::<usize>()
        + turn
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() + text(&c.result))
            .sum::<usize>()
        // Structured data is kept as parsed JSON: about its text's size.
        + turn.data.as_ref().map_or(0, json_bytes)
        + turn.spans.iter().map(span_bytes).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NodeRecord, TurnRecord};

    fn node(reply_bytes: usize) -> Event {
        Event::Node(NodeRecord {
            suite: "s".into(),
            scenario: "c".into(),
            agent: "a".into(),
            repetition: 0,
            node: "start".into(),
            parent: None,
            turns: vec![std::sync::Arc::new(TurnRecord {
                reply: Some("x".repeat(reply_bytes)),
                ..Default::default()
            })],
        })
    }

    #[tokio::test]
    async fn the_stream_holds_back_once_its_bytes_are_taken_and_not_before() {
        let (tx, mut rx) = channel();
        // Small events pass by the hundred.
        for _ in 0..100 {
            tx.send(node(10)).await.unwrap();
        }
        // 40 MiB events: three fit in 128 MiB, the fourth waits for the reporter.
        let big = 40 * 1024 * 1024;
        for _ in 0..3 {
            tx.send(node(big)).await.unwrap();
        }
        let fourth = tx.send(node(big));
        tokio::pin!(fourth);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut fourth)
                .await
                .is_err(),
            "sent past the budget"
        );
        for _ in 0..101 {
            rx.recv().await.unwrap();
        }
        fourth.await.unwrap();
        // An event over the whole budget still goes, alone.
        for _ in 0..3 {
            rx.recv().await.unwrap();
        }
        tx.send(node(EVENT_BYTES * 2)).await.unwrap();
        assert!(matches!(rx.recv().await, Some(Event::Node(_))));
    }

    #[tokio::test]
    async fn a_sender_waiting_for_room_is_told_when_the_receiver_is_gone() {
        let (tx, rx) = channel();
        tx.send(node(EVENT_BYTES)).await.unwrap();
        let waiting = tokio::spawn(async move { tx.send(node(10)).await.is_err() });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(rx);
        assert!(
            waiting.await.unwrap(),
            "the send failed instead of waiting forever"
        );
    }

    #[test]
    fn spans_and_judges_words_weigh_what_they_carry() {
        let mb = 1024 * 1024;
        let span = || trellis_records::SpanRecord {
            attributes: serde_json::json!({"input.value": "x".repeat(mb)})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        };
        let units = |bytes: usize| (bytes / UNIT) as u32;
        let Event::Node(mut with_spans) = node(10) else {
            unreachable!()
        };
        with_spans.turns[0] = std::sync::Arc::new(TurnRecord {
            spans: vec![span(), span()],
            ..Default::default()
        });
        assert!(weight(&Event::Node(with_spans)) >= units(2 * mb));
        let late = trellis_records::SpanBatch {
            spans: vec![span(); 3],
            ..Default::default()
        };
        assert!(weight(&Event::Spans(Box::new(late))) >= units(3 * mb));
        let verdict = trellis_records::JudgeVerdict {
            justification: Some("y".repeat(mb)),
            ..Default::default()
        };
        let panel = trellis_records::JudgeVerdict {
            members: vec![verdict.clone(), verdict],
            ..Default::default()
        };
        let trajectory: trellis_records::TrajectoryRecord =
            serde_json::from_value(serde_json::json!({
                "suite": "s", "scenario": "c", "trajectory": "t", "agent": "a",
                "protocol": "p", "repetition": 0, "nodes": [], "status": "passed",
                "turns": 1, "duration_ms": 1.0, "tags": [],
                "criteria": [{"criterion": "judge", "kind": "judge", "status": "passed",
                    "judge": panel}],
            }))
            .unwrap();
        assert!(weight(&Event::Trajectory(Box::new(trajectory))) >= units(2 * mb));
    }

    #[tokio::test]
    async fn a_permit_dropped_unused_gives_its_room_back() {
        let (tx, _rx) = channel();
        let huge = node(EVENT_BYTES);
        for _ in 0..3 {
            let permit = tx.reserve(&huge).await.unwrap();
            drop(permit);
        }
    }
}
