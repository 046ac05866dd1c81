//! The process's allocator: mimalloc, which also counts allocations when
//! `TRELLIS_COUNT_ALLOCATIONS=FILE` is set, and writes the count to FILE when the process
//! exits.
//!
//! This is the cheap, deterministic guard against large performance regressions
//! (`tests/cli/perf.rs`, docs/performance.md): instruction counters are not available in
//! every CI virtual machine, and wall time is too noisy on shared runners, while the number
//! of allocations a command makes tracks the work it does (the kdl parser's per-character
//! allocations multiplied `trellis check`'s count many times over) and barely varies
//! between runs. When the variable is unset, the cost is one relaxed load per allocation.

use std::alloc::{GlobalAlloc, Layout};
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The variable naming the file the count is written to.
pub const VARIABLE: &str = "TRELLIS_COUNT_ALLOCATIONS";

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static REPORT_TO: OnceLock<PathBuf> = OnceLock::new();

/// mimalloc, counting calls that allocate (`alloc`, `alloc_zeroed`, `realloc`) while
/// counting is on.
pub struct Counting;

impl Counting {
    #[inline]
    fn count() {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded unchanged to mimalloc, a correct `GlobalAlloc`; counting
// touches only atomics and never allocates.
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's guarantees, passed on.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's guarantees, passed on.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees, passed on.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's guarantees, passed on.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Turns counting on when [`VARIABLE`] names a file, and arranges for the count to be
/// written there however the process exits normally (`main`'s end, which calls
/// [`report_now`], or `std::process::exit`; not a signal or an abort).
pub fn start_if_asked() {
    let Some(path) = std::env::var_os(VARIABLE).filter(|p| !p.is_empty()) else {
        return;
    };
    if REPORT_TO.set(PathBuf::from(path)).is_err() {
        return;
    }
    // SAFETY: `report` is an `extern "C" fn()` that does not unwind.
    if unsafe { libc::atexit(report) } == 0 {
        COUNTING.store(true, Ordering::Relaxed);
    }
}

/// Writes the count now, for a process that ends without the C library's exit handlers
/// (`main`'s `_exit`). Does nothing unless counting was asked for.
pub fn report_now() {
    report();
}

extern "C" fn report() {
    // Stop first: writing the file allocates.
    COUNTING.store(false, Ordering::Relaxed);
    let count = ALLOCATIONS.load(Ordering::Relaxed);
    if let Some(path) = REPORT_TO.get()
        && let Err(e) = std::fs::write(path, format!("{count}\n"))
    {
        // Not `eprintln!`, which panics when stderr is gone: this function must not unwind.
        let _ = writeln!(
            std::io::stderr(),
            "warning: cannot write the allocation count to {}: {e}",
            path.display()
        );
    }
}
