//! The one stop signal of the commands that run for a while (`run`, `watch`, `rejudge`,
//! `agent`): SIGINT (Ctrl-C) or SIGTERM (CI cancellation, `docker stop`) asks for a graceful
//! stop, a second one for a hard stop. What "graceful" means is the command's business
//! (`run` lets calls in flight finish, see [`super::run`]); the exit codes are shared and
//! documented in docs/results.md.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit code when Ctrl-C (SIGINT) stopped the command; finished work is still reported.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit code when SIGTERM stopped the command.
pub const EXIT_TERMINATED: u8 = 143;

/// What stopped a command before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    Interrupt,
    Terminate,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "interrupted (SIGINT)",
            StopSignal::Terminate => "terminated (SIGTERM)",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Interrupt => EXIT_INTERRUPTED,
            StopSignal::Terminate => EXIT_TERMINATED,
        }
    }
}

/// SIGINT and SIGTERM, watched from when this is made: make it before starting the work a
/// signal should stop, so an early signal is not lost.
pub struct Signals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
}

impl Signals {
    /// Must run inside a tokio runtime. A signal that cannot be watched keeps its default
    /// action (the process stops; a journal keeps what finished).
    pub fn watch() -> Self {
        Signals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// The next signal. Cancel-safe: a signal that arrives while nobody waits is kept for
    /// the next call.
    pub async fn next(&mut self) -> StopSignal {
        async fn recv(signal: &mut Option<Signal>) -> Option<()> {
            match signal {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            Some(()) = recv(&mut self.interrupt) => StopSignal::Interrupt,
            Some(()) = recv(&mut self.terminate) => StopSignal::Terminate,
            else => std::future::pending().await,
        }
    }
}

/// Tokio keeps SIGINT and SIGTERM once it has watched for them. Writing reports after a
/// stop is not worth trapping the user for: from here on either signal stops the process
/// (the journal is on disk, files are renamed into place only when complete, and `trellis
/// report` rebuilds the rest).
pub fn restore_default_signals() {
    // SAFETY: resetting a signal to its default disposition has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}
