//! OpenTelemetry in: the agents' own spans, received over OTLP/HTTP and matched to the
//! turns that caused them.
//!
//! Every turn carries a W3C `traceparent` naming a span of its own
//! ([`crate::transport::trace`]); an instrumented agent's spans for that request name it (or
//! a descendant of it) as their parent. [`SpanReceiver`] is the run's OTLP/HTTP endpoint
//! (`POST /v1/traces`, protobuf or JSON); [`SpanStore`] keeps what arrived, bounded, and
//! resolves each span to its turn through its parent chain, so an agent's spans can be put
//! on the turn's record (agents with `spans #true`, after a bounded wait for the agent's
//! root span) or, when they come later, handed out at the end of the run as late batches.
//! [`tools`] reads the GenAI `execute_tool` spans of a turn as tool calls for the tool
//! criteria. [`export`] is the other direction: Trellis's own spans, built from the run's
//! events, sent to a collector.

pub mod export;
pub(crate) mod receiver;
mod store;
pub mod tools;

pub use receiver::{ReceiverError, SpanReceiver};
pub use store::{SpanStore, TurnKey};

use std::sync::Arc;
use std::time::Duration;

/// How a run deals with OpenTelemetry (`RunOptions::telemetry`).
#[derive(Clone, Debug)]
pub struct Telemetry {
    /// The run's trace (the caller's `TRACEPARENT`, or a new one); `None`: the engine takes
    /// it from the environment. Given when the exporter must know the run's span.
    pub trace: Option<crate::transport::trace::RunTrace>,
    /// The run's OTLP receiver (`--otlp-receiver`, or started for `spans #true` agents);
    /// `None`: no spans are collected.
    pub receiver: Option<Arc<SpanReceiver>>,
    /// The receiver's address was given (`--otlp-receiver`), so any agent may have been told
    /// it and the end of the run waits for every turn's root span. Otherwise only agents
    /// with `spans #true` are handed the address, and only their turns are waited for.
    pub receiver_given: bool,
    /// How long a turn of a `spans #true` agent waits for the agent's root span after the
    /// answer (`--spans-wait`).
    pub spans_wait: Duration,
    /// How long the end of the run waits for spans still missing (`--spans-grace`).
    pub spans_grace: Duration,
    /// Told of waits for spans a person would otherwise sit through unexplained
    /// ([`SpansNotice`]), so that whoever shows the run can say why.
    pub notices: Option<SpansNotices>,
}

/// A wait for agents' spans worth telling the person watching the run about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpansNotice<'a> {
    /// A turn of `agent` waited the whole `wait` (`--spans-wait`) after its answer and no
    /// span of it arrived: each of its turns will wait as long.
    /// `foreign`: spans of other traces the receiver took in (and dropped) so far, which
    /// says the agent's spans arrive but do not continue the `traceparent` it was sent.
    TurnGotNone {
        agent: &'a str,
        wait: Duration,
        foreign: u64,
        /// Export requests the receiver refused so far, and the last one's reason: spans
        /// sent where they should go, in a form it cannot read.
        refused: Option<(u64, &'a str)>,
        /// An earlier turn of the agent got its spans: they reach the receiver, and this
        /// turn made none (or sent them late).
        reached: bool,
    },
    /// The end of the run has waited a moment and goes on waiting, up to `grace`
    /// (`--spans-grace`), for the root spans of `turns` turns.
    EndWaits { turns: usize, grace: Duration },
    /// `spans` spans of `agent` arrived only after their turns' checks were done (more than
    /// `wait` after the answer): recorded `late`, seen by none of those checks.
    Late {
        agent: &'a str,
        spans: u64,
        wait: Duration,
    },
}

/// What the run calls with each [`SpansNotice`] ([`Telemetry::notices`]).
#[derive(Clone)]
pub struct SpansNotices(pub Arc<dyn Fn(SpansNotice<'_>) + Send + Sync>);

impl std::fmt::Debug for SpansNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpansNotices")
    }
}

/// Five seconds: the default export delay of the OpenTelemetry SDKs' batch processors
/// (`OTEL_BSP_SCHEDULE_DELAY`), so spans of an agent left at its defaults arrive in time.
pub const DEFAULT_SPANS_WAIT: Duration = Duration::from_secs(5);

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            trace: None,
            receiver: None,
            receiver_given: false,
            spans_wait: DEFAULT_SPANS_WAIT,
            spans_grace: DEFAULT_SPANS_WAIT,
            notices: None,
        }
    }
}
