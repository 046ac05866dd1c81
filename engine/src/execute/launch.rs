//! What the engine needs from whoever serves builtin agents (`builtin="NAME"`): start one
//! for a run, say where it is, and keep it running until the run lets go of it.
//!
//! The reference agents themselves live outside the engine (the `trellis-agents` crate); the
//! CLI hands a [`Launcher`] to [`super::run`] through [`super::RunOptions::launcher`]. The
//! engine keeps what a launch returns for the length of the run and drops it at the end,
//! which stops the agent. A run without a launcher records a setup fault on the
//! trajectories of its builtin agents and runs everything else.

use std::any::Any;
use std::fmt;

use futures::future::BoxFuture;
use trellis_dsl::{BuiltinTransport, ProcessMode};

/// Starts builtin agents. Implementations are shared across a run's agents (and, for
/// `trellis watch`, across runs), so they take `&self`.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// Starts the builtin `request.name` of the protocol named `request.protocol` (as
    /// `protocol=` spells it), served the way `request.transport` asks.
    fn launch<'a>(
        &'a self,
        request: LaunchRequest<'a>,
    ) -> BoxFuture<'a, Result<Launched, LaunchError>>;
}

/// One builtin agent to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchRequest<'a> {
    /// The protocol's name, as `protocol=` spells it (`connexity`, `multiagent`, …).
    pub protocol: &'a str,
    /// The builtin's name (`builtin="…"`).
    pub name: &'a str,
    /// How the agent is reached (`transport=`; HTTP unless the protocol says otherwise).
    pub transport: BuiltinTransport,
    /// For a process: one per call or one per trajectory (`process=`).
    pub process: ProcessMode,
    /// The run's OTLP/HTTP receiver (`http://127.0.0.1:PORT`) for an agent with
    /// `spans #true`: where a builtin that emits spans sends them.
    pub otlp_endpoint: Option<&'a str>,
}

/// Where a started builtin is, in the form its agent's client takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuiltinEndpoint {
    /// `http://127.0.0.1:PORT/PATH`.
    Url(String),
    /// `tcp:127.0.0.1:PORT` or `unix:/PATH`, for the line transport.
    Socket(String),
    /// A shell command that runs the agent as a process; the agent's client starts it.
    Command(String),
}

/// A started builtin: where it is, and what keeps it running. Dropping `guard` stops the
/// agent; the engine holds it until the run ends (`None`: nothing to stop, as for a process
/// the client starts itself).
pub struct Launched {
    pub endpoint: BuiltinEndpoint,
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

impl fmt::Debug for Launched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launched")
            .field("endpoint", &self.endpoint)
            .field("guard", &self.guard.is_some())
            .finish()
    }
}

/// Why a builtin agent did not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The run was given no [`Launcher`].
    #[error("this run has no launcher for builtin agents")]
    NoLauncher,
    /// The launcher could not start it (unknown name, transport it cannot speak, no port).
    #[error(transparent)]
    Failed(Box<dyn std::error::Error + Send + Sync>),
}
