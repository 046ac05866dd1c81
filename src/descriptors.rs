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
/// and its pidfd; and those the process holds besides (listeners, builtin agents, files).
const PER_CALL: usize = 4;
const BESIDES: usize = 48;

/// `jobs` as the descriptor limit allows it, with a notice when that is fewer: past the
/// limit a call's connection fails with "Too many open files", recorded as the agent's
/// `connect` or `setup` fault, though the agent did nothing wrong.
pub fn jobs_within_limit(jobs: usize) -> (usize, Option<String>) {
    let Some(&limit) = LIMIT.get().filter(|&&l| l > 0) else {
        return (jobs, None);
    };
    let fits = (limit.saturating_sub(BESIDES) / PER_CALL).max(1);
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
