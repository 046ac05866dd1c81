//! Room in the process's descriptor table for a run's connections, made before any thread
//! starts.
//!
//! Linux keeps a process's open descriptors in a table that starts with 64 slots and
//! doubles when a new descriptor does not fit. In a process of more than one thread each
//! doubling waits for an RCU grace period (another thread may still read the old table), and
//! the thread that opened the descriptor sleeps, uninterruptibly, until it ends: up to
//! 27 ms on the 2-core VM. That thread is the run's: its units open their connections as
//! they start, so a run at `--jobs 256` doubles its table three times in its first wave
//! (past 64, 128 and 256 descriptors), and every later wave starts as much later as those
//! waits took (docs/performance.md, "What was slow, and why it is not any more"). A
//! process with one thread grows its table without the wait, so `main` reserves what the
//! command will need before it starts any.
//!
//! The same reservation raises the soft limit on open descriptors when the command needs
//! more than it allows (up to the hard limit, which only an administrator can raise): a
//! shell's usual 1,024 would otherwise fail a run at `--jobs 2000` against a slow agent with
//! `Too many open files` on a quarter of its connections. A command that needs no more
//! leaves the limit, and so what its child processes inherit, as it was.

/// Makes room for `slots` open descriptors: raises the soft `RLIMIT_NOFILE` to `slots` if
/// it is lower (within the hard limit), then grows the descriptor table to at least that,
/// by duplicating a standard descriptor onto the highest slot and closing the copy. The
/// table is left as it is when it is that large already, the limit is lower than a table's
/// first size, or no standard descriptor is open. Call it before the process starts a
/// thread.
pub fn reserve(slots: usize) {
    let limit = soft_limit_raised_to(slots);
    let _ = LIMIT.set(limit);
    let highest = slots.min(limit).saturating_sub(1);
    // Smaller tables are the kernel's first one.
    if highest < 64 {
        return;
    }
    let Ok(highest) = libc::c_int::try_from(highest) else {
        return;
    };
    for standard in 0..=2 {
        // SAFETY: `F_DUPFD_CLOEXEC` opens a new descriptor, the lowest free one at or above
        // `highest`, and touches no open one; it is closed at once, before any other code
        // of this process could see it.
        let copy = unsafe { libc::fcntl(standard, libc::F_DUPFD_CLOEXEC, highest) };
        if copy >= 0 {
            // SAFETY: `copy` was opened just above and nothing else holds it.
            unsafe { libc::close(copy) };
            return;
        }
    }
}

/// The soft limit on open descriptors once [`reserve`] raised it as far as it could.
static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Descriptors a call in flight may hold: a connection, or an agent process's three pipes
/// and its pidfd; and those the process holds besides (listeners, files).
const PER_CALL: usize = 4;
const BESIDES: usize = 48;

/// What the run's agents hold open, for [`jobs_within_limit`]: each agent reached over a
/// connection keeps up to one idle connection per job once it has answered that many at
/// once, and a builtin agent, served in this process, holds the other end of each too
/// (and its listener, runtime and wake-up descriptors).
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentDescriptors {
    /// Builtin agents (two descriptors a connection, and a few of their own).
    pub builtin: usize,
    /// Agents reached over a connection of their own elsewhere (one a connection).
    pub remote: usize,
    /// Agents run as processes (three pipes and a pidfd each).
    pub process: usize,
}

impl AgentDescriptors {
    /// Those of agents reached at `endpoints`.
    pub fn of<'a>(endpoints: impl IntoIterator<Item = &'a trellis_dsl::Endpoint>) -> Self {
        let mut out = AgentDescriptors::default();
        for endpoint in endpoints {
            match endpoint {
                trellis_dsl::Endpoint::Builtin(_) => out.builtin += 1,
                trellis_dsl::Endpoint::Command(_) => out.process += 1,
                trellis_dsl::Endpoint::Url(_)
                | trellis_dsl::Endpoint::Socket(_)
                | trellis_dsl::Endpoint::Provider(_) => out.remote += 1,
            }
        }
        out
    }

    /// Descriptors a job may come to hold over the run: the most its in-flight call holds,
    /// or the connections every agent's pool keeps for it, whichever is more.
    fn per_job(self) -> usize {
        PER_CALL.max(2 * self.builtin + self.remote + PER_CALL * self.process)
    }

    /// Descriptors the agents hold however many jobs run.
    fn fixed(self) -> usize {
        4 * self.builtin
    }
}

/// `jobs` as the descriptor limit allows it, with a notice when that is fewer: past the
/// limit a call's connection fails with "Too many open files", recorded as the agent's
/// `connect` or `setup` fault, though the agent did nothing wrong.
pub fn jobs_within_limit(jobs: usize, agents: AgentDescriptors) -> (usize, Option<String>) {
    let Some(&limit) = LIMIT.get().filter(|&&l| l > 0) else {
        return (jobs, None);
    };
    let needed = jobs
        .saturating_mul(agents.per_job())
        .saturating_add(BESIDES + agents.fixed());
    // `reserve` raised the soft limit for a connection a call; many agents may need more,
    // as far as the hard limit allows.
    let limit = if limit < needed {
        soft_limit_raised_to(needed)
    } else {
        limit
    };
    let one_call = BESIDES + agents.fixed() + agents.per_job();
    if limit < one_call {
        return (
            1,
            Some(format!(
                "this process may open {limit} files at most (the hard limit, `ulimit -Hn`), \
                 and the run's agents need about {one_call} for even one call at a time: calls \
                 may fail as the agents' faults; raise the hard limit"
            )),
        );
    }
    let fits = (limit.saturating_sub(BESIDES + agents.fixed()) / agents.per_job()).max(1);
    if jobs <= fits {
        return (jobs, None);
    }
    (
        fits,
        Some(format!(
            "--jobs {jobs} lowered to {fits}: this process may open {limit} files at most (the \
             hard limit, `ulimit -Hn`), and more calls in flight would fail as the agents' \
             faults; raise the hard limit to run more at once"
        )),
    )
}

/// The soft limit on open descriptors (a descriptor must be below it), first raised to
/// `slots` when it is lower, as far as the hard limit allows.
fn soft_limit_raised_to(slots: usize) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the limit into `limit`, which lives through the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    let wanted = libc::rlim_t::try_from(slots).unwrap_or(libc::rlim_t::MAX);
    if limit.rlim_cur < wanted {
        let raised = libc::rlimit {
            rlim_cur: wanted.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `setrlimit` reads `raised`, which lives through the call. Refused (a
        // system that caps the soft limit lower), the limit stays what it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = raised.rlim_cur;
        }
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}
