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
///
/// A layout aligned to a word or less goes to mimalloc's plain entry points (`mi_malloc`,
/// `mi_zalloc`, `mi_realloc`), as the standard library's `System` allocator sends such
/// layouts to `malloc`: every mimalloc block is at least word-aligned (its size classes are
/// whole words, and a page's first block is 16-byte aligned), and the aligned entry points
/// the `mimalloc` crate always calls check the alignment and look the block up again first.
/// Nearly every allocation is word-aligned; that was about 10% of the run's thread's
/// instructions going to allocation, a third of it those checks (docs/performance.md, "The
/// allocator's plain entry points").
pub struct Counting;

/// The alignment every mimalloc block has whatever its size.
const WORD: usize = std::mem::size_of::<usize>();

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
        if layout.align() <= WORD {
            // SAFETY: a non-zero size (the caller's guarantee); the block is word-aligned.
            return unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() };
        }
        // SAFETY: the caller's guarantees, passed on.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count();
        if layout.align() <= WORD {
            // SAFETY: as in `alloc`.
            return unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() };
        }
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
        if layout.align() <= WORD {
            // SAFETY: `ptr` came from this allocator with `layout` (the caller's guarantee);
            // the moved block is word-aligned like any other.
            return unsafe { libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast() };
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout gets a block aligned as it asks, zeroed when asked, and a reallocation,
    /// larger or smaller, keeps the contents and the alignment: on the plain entry points
    /// (word-aligned layouts) and the aligned ones alike.
    #[test]
    fn blocks_are_aligned_as_their_layouts_ask_on_either_path() {
        let sizes = (1..=300).chain([511, 512, 1000, 1024, 4095, 4096, 8192, 65_536, 5 << 20]);
        let sizes = sizes.collect::<Vec<usize>>();
        let pattern = |i: usize| (i % 251) as u8;
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for &size in &sizes {
                let layout = |size| Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; each block is written and read within its size and
                // freed once, with the layout of its last allocation or reallocation.
                unsafe {
                    let zeroed = Counting.alloc_zeroed(layout(size));
                    assert!(!zeroed.is_null());
                    assert_eq!(zeroed as usize % align, 0, "zeroed {size} bytes at {align}");
                    assert!(
                        std::slice::from_raw_parts(zeroed, size)
                            .iter()
                            .all(|&b| b == 0)
                    );
                    Counting.dealloc(zeroed, layout(size));

                    let block = Counting.alloc(layout(size));
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "{size} bytes at {align}");
                    for i in 0..size {
                        block.add(i).write(pattern(i));
                    }
                    let larger = size * 3 + 7;
                    let grown = Counting.realloc(block, layout(size), larger);
                    assert!(!grown.is_null());
                    assert_eq!(grown as usize % align, 0, "{size} -> {larger} at {align}");
                    assert!((0..size).all(|i| grown.add(i).read() == pattern(i)));
                    let smaller = size / 2 + 1;
                    let shrunk = Counting.realloc(grown, layout(larger), smaller);
                    assert!(!shrunk.is_null());
                    assert_eq!(
                        shrunk as usize % align,
                        0,
                        "{larger} -> {smaller} at {align}"
                    );
                    assert!((0..smaller).all(|i| shrunk.add(i).read() == pattern(i)));
                    Counting.dealloc(shrunk, layout(smaller));
                }
            }
        }
    }
}
