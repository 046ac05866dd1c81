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

/// Grows the descriptor table to at least `slots` (within the soft `RLIMIT_NOFILE`), by
/// duplicating a standard descriptor onto the highest slot and closing the copy. Does
/// nothing when the table is that large already, the limit is lower than a table's first
/// size, or no standard descriptor is open. Call it before the process starts a thread.
pub fn reserve(slots: usize) {
    let highest = slots.min(soft_limit()).saturating_sub(1);
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

/// The soft limit on open descriptors; a descriptor must be below it.
fn soft_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the limit into `limit`, which lives through the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}
