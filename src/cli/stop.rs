//! The one stop signal of the commands that run for a while (`run`, `watch`, `rejudge`,
//! `agent`): SIGINT (Ctrl-C), SIGTERM (CI cancellation, `docker stop`) or SIGHUP (the
//! terminal or SSH session closed) asks for a graceful stop, a second one for a hard stop. What "graceful" means is the command's business
//! (`run` lets calls in flight finish, see [`super::run`]); the exit codes are shared and
//! documented in docs/results.md. A command made of several pieces watches once, through
//! a [`SignalRelay`].

use std::sync::atomic::{AtomicI32, Ordering};

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit code when Ctrl-C (SIGINT) stopped the command; finished work is still reported.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit code when SIGTERM stopped the command.
pub const EXIT_TERMINATED: u8 = 143;
/// Exit code when SIGHUP stopped the command.
pub const EXIT_HUNG_UP: u8 = 129;

/// What stopped a command before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    Interrupt,
    Terminate,
    /// The controlling terminal went away. Stopped as for SIGTERM: the default action would
    /// kill the run without its results, and leave agent processes (each in a process
    /// group of its own, which the hangup does not reach) running.
    Hangup,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "interrupted (SIGINT)",
            StopSignal::Terminate => "terminated (SIGTERM)",
            StopSignal::Hangup => "hung up (SIGHUP)",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            StopSignal::Interrupt => EXIT_INTERRUPTED,
            StopSignal::Terminate => EXIT_TERMINATED,
            StopSignal::Hangup => EXIT_HUNG_UP,
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, watched from when this is made: make it before starting the
/// work a signal should stop, so an early signal is not lost.
pub struct Signals {
    interrupt: Option<Signal>,
    terminate: Option<Signal>,
    hangup: Option<Signal>,
    /// Made by [`SignalRelay::signals`]: the command's signals so far, and how many of them
    /// this one returned.
    relay: Option<(tokio::sync::watch::Receiver<Vec<StopSignal>>, usize)>,
}

/// One watcher of SIGINT and SIGTERM for a whole command made of several pieces, each on a
/// runtime of its own (`variance`: a judge condition, then two runs). Tokio installs its
/// handler once per process, so a piece that restored the default disposition
/// ([`restore_default_signals`]) would leave the next piece's watcher deaf and a signal
/// between pieces would go unseen; the relay watches on a thread of its own from start to
/// end instead, and each piece reads the command's signals from it ([`Self::signals`]).
#[derive(Clone)]
pub struct SignalRelay {
    received: tokio::sync::watch::Receiver<Vec<StopSignal>>,
}

impl SignalRelay {
    /// Starts watching; returns once the handlers are installed. `announce` is said on
    /// stderr when the first signal arrives (the piece then running may be silent).
    pub fn start(announce: Option<String>) -> std::io::Result<SignalRelay> {
        let (tx, received) = tokio::sync::watch::channel(Vec::new());
        let (ready, installed) = std::sync::mpsc::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("trellis-signals".into())
            .spawn(move || {
                runtime.block_on(async {
                    let mut signals = Signals::watch();
                    let _ = ready.send(());
                    loop {
                        let signal = signals.next().await;
                        let first = tx.borrow().is_empty();
                        if first && let Some(announce) = &announce {
                            super::console::errln!("{}: {announce}", signal.name());
                        }
                        tx.send_modify(|all| all.push(signal));
                    }
                });
            })?;
        // The thread only fails to say so if it died before watching: then the default
        // dispositions stand, as for `Signals::watch` without a handler.
        let _ = installed.recv();
        Ok(SignalRelay { received })
    }

    /// The command's first signal, if one arrived.
    pub fn stopped(&self) -> Option<StopSignal> {
        self.received.borrow().first().copied()
    }

    /// The command's signals for one piece, from the first: a signal that arrived before
    /// the piece started stops it at once, and the next one is its "again".
    pub fn signals(&self) -> Signals {
        Signals {
            interrupt: None,
            terminate: None,
            hangup: None,
            relay: Some((self.received.clone(), 0)),
        }
    }
}

impl Signals {
    /// Must run inside a tokio runtime. A signal that cannot be watched keeps its default
    /// action (the process stops; a journal keeps what finished).
    pub fn watch() -> Self {
        Signals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
            hangup: signal(SignalKind::hangup()).ok(),
            relay: None,
        }
    }

    /// The next signal. Cancel-safe: a signal that arrives while nobody waits is kept for
    /// the next call.
    pub async fn next(&mut self) -> StopSignal {
        if let Some((received, seen)) = &mut self.relay {
            let wanted = *seen + 1;
            // The guard is let go before anything else is awaited (it is not `Send`).
            let signal = received
                .wait_for(|all| all.len() >= wanted)
                .await
                .ok()
                .and_then(|all| all.get(wanted - 1).copied());
            return match signal {
                Some(signal) => {
                    *seen = wanted;
                    signal
                }
                // The relay's thread is gone: no signal will come this way.
                None => std::future::pending().await,
            };
        }
        async fn recv(signal: &mut Option<Signal>) -> Option<()> {
            match signal {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            Some(()) = recv(&mut self.interrupt) => StopSignal::Interrupt,
            Some(()) = recv(&mut self.terminate) => StopSignal::Terminate,
            Some(()) = recv(&mut self.hangup) => StopSignal::Hangup,
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
        libc::signal(libc::SIGHUP, libc::SIG_DFL);
    }
}

/// The signal that arrived while a run that was not stopped wrote its results (0: none).
static LATE_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// After a run that ended by itself: its results are being written (tables, the report,
/// the comparison with a baseline). A CI cancelled at that moment must not leave a run that
/// lists as finished without its results, so a first SIGINT or SIGTERM lets them finish (it
/// is said, and [`late_signal`] gives it for the exit code); a second stops the process at
/// once, as [`restore_default_signals`] would.
pub fn finish_results_through_signals() {
    extern "C" fn on_signal(signal: libc::c_int) {
        if LATE_SIGNAL
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            const SAID: &[u8] = b"\nsignal received while the results are written: finishing \
                them (signal again to stop at once)\n";
            // SAFETY: write(2) is async-signal-safe; the buffer is a static.
            unsafe {
                libc::write(2, SAID.as_ptr().cast(), SAID.len());
            }
        } else {
            // SAFETY: signal(2) and raise(3) are async-signal-safe.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
        }
    }
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only touches an atomic and async-signal-safe calls. glibc's
    // signal(2) restarts interrupted system calls, so a file being written is not cut.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGHUP, handler as libc::sighandler_t);
    }
}

/// The signal [`finish_results_through_signals`] held off, if one came.
pub fn late_signal() -> Option<StopSignal> {
    match LATE_SIGNAL.load(Ordering::SeqCst) {
        libc::SIGINT => Some(StopSignal::Interrupt),
        libc::SIGTERM => Some(StopSignal::Terminate),
        libc::SIGHUP => Some(StopSignal::Hangup),
        _ => None,
    }
}
