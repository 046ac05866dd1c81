//! The execution event stream: the one channel between the runner and every reporter.
//!
//! The executor sends each [`Event`] as it happens (run started, an execution node's turns,
//! a finished trajectory, run finished); reporters — the journal writer, the progress bar,
//! the summary — consume the same stream, so what is shown and what is stored never
//! disagree. Events are the journal's entries: storing an event is writing one line.

use tokio::sync::mpsc;

pub use crate::record::JournalEntry as Event;

/// The sending half the executor holds. Bounded, so a slow reporter applies backpressure
/// instead of letting finished records pile up in memory.
pub type EventSender = mpsc::Sender<Event>;
pub type EventReceiver = mpsc::Receiver<Event>;

/// Capacity of the event channel.
pub const EVENT_BUFFER: usize = 1024;

pub fn channel() -> (EventSender, EventReceiver) {
    mpsc::channel(EVENT_BUFFER)
}
