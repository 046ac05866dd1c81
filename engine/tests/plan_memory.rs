//! Planning a big suite stays within a small multiple of the suite's text: the heap bytes
//! `Plan::build` holds at its peak are counted by a global allocator of this test binary
//! (its own binary, so no other test allocates while it measures).
//!
//! Figures for the release binary on whole files are in README.md, "Performance".

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use trellis_engine::plan::{Plan, Selection};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only add.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test for its whole length: the test harness runs a binary's tests on
/// parallel threads, and the counters above would add one test's allocations to the other's.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn measuring() -> std::sync::MutexGuard<'static, ()> {
    MEASURING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Heap bytes `f` holds at its peak, above what was allocated when it started.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

const HEAD: &str = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nsuite \"big\"\n";

/// One scenario whose branches nest `depth` levels deep, with `leaves` sibling branches at
/// every level besides the one that goes deeper.
fn nested(depth: usize, leaves: usize) -> String {
    let mut text = format!("{HEAD}scenario \"s\" {{\nuser \"Hello\"\n");
    for d in 0..depth {
        for i in 0..leaves {
            let _ = writeln!(
                text,
                "branch \"l{d}-{i}\" {{\nuser \"level {d} leaf {i}\"\n}}"
            );
        }
        let _ = writeln!(text, "branch \"deeper{d}\" {{\nuser \"deeper {d}\"");
    }
    text.push_str(&"}\n".repeat(depth + 1));
    text
}

/// `n` small scenarios, as an importer writes them.
fn flat(n: usize) -> String {
    let mut text = HEAD.to_string();
    for i in 0..n {
        let _ = writeln!(
            text,
            "scenario \"s-{i}\" {{\n    user \"Hello, I would like to book a duct cleaning for \
             order {i}\"\n    expect reply contains=\"postal code\"\n    user \"It is V4T 0A7.\"\n}}"
        );
    }
    text
}

/// `n` small scenarios whose messages and checks are templates.
fn templated(n: usize) -> String {
    let mut text = HEAD.to_string();
    for i in 0..n {
        let _ = writeln!(
            text,
            "scenario \"t-{i}\" {{\n    user-context {{ order \"A-{i}\" }}\n    user \"Hello, I \
             would like to book a duct cleaning for order {{{{ user_context.order }}}}\"\n    \
             expect reply contains=\"{{{{ user_context.order }}}}\"\n}}"
        );
    }
    text
}

/// `n` small scenarios of a project that declares `tools` tools (as imported MultiAgentEval
/// suites do).
fn with_tools(n: usize, tools: usize) -> String {
    let mut text =
        String::from("agent \"a\" protocol=\"multiagent\" builtin=\"support\"\nsuite \"big\"\n");
    for k in 0..tools {
        let _ = writeln!(
            text,
            "tool \"tool_{k}\" {{\n    param \"order_id\" required=#true\n    mock \
             returns=#\"{{\"status\": \"ok\", \"tool\": {k}}}\"# order_id=\"A-1\"\n    mock \
             returns=#\"{{\"status\": \"not_found\"}}\"#\n}}"
        );
    }
    for i in 0..n {
        let _ = writeln!(
            text,
            "scenario \"s-{i}\" {{\n    user \"Please refund order A-{i}, it arrived broken\"\n    \
             expect tool \"tool_1\" order_id=\"A-{i}\"\n    user \"Thank you, bye.\"\n}}"
        );
    }
    text
}

/// Loads `text` as a suite file and returns the heap bytes planning it held at its peak.
fn plan_peak(text: &str) -> (usize, u64) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("big.kdl");
    std::fs::write(&path, text).expect("suite written");
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|e| panic!("{}", e.render_plain()));
    let everything = Selection {
        include_inactive: true,
        ..Selection::default()
    };
    let (plan, peak) = peak_during(|| Plan::build(&project, &everything).expect("plan"));
    (peak, plan.trajectory_count())
}

#[test]
fn planning_memory_stays_a_small_multiple_of_the_suite() {
    let _measuring = measuring();
    // Deeply nested branches: every trajectory's node ids were strings of their own, bytes
    // growing with the square of the depth (620x the text here, 120x without).
    let text = nested(120, 8);
    let (peak, trajectories) = plan_peak(&text);
    eprintln!("nested: {peak} bytes for {} bytes of suite", text.len());
    assert_eq!(trajectories, 120 * 8 + 1);
    assert!(
        peak < 200 * text.len(),
        "planning {} nested branches ({} bytes of suite) held {peak} bytes",
        120 * 9,
        text.len()
    );

    // Many small scenarios: a template scope built per scenario up front and the spare room
    // of growing vectors made it ~30x, and a copy of every scenario another ~8x.
    let text = flat(3_000);
    let (peak, trajectories) = plan_peak(&text);
    eprintln!("flat: {peak} bytes for {} bytes of suite", text.len());
    assert_eq!(trajectories, 3_000);
    assert!(
        peak < 15 * text.len(),
        "planning 3,000 scenarios ({} bytes of suite) held {peak} bytes",
        text.len()
    );

    // A project's tools: every scenario's sandbox had a copy of all of them (~180x here).
    // (A `tool` check's parameters are a JSON map, ~600 bytes however few they are.)
    let text = with_tools(3_000, 20);
    let (peak, trajectories) = plan_peak(&text);
    eprintln!("tools: {peak} bytes for {} bytes of suite", text.len());
    assert_eq!(trajectories, 3_000);
    assert!(
        peak < 16 * text.len(),
        "planning 3,000 scenarios of a project with 20 tools ({} bytes of suite) held {peak} \
         bytes",
        text.len()
    );

    // Templates: every one was kept compiled (~10 KB each), ~100x the text here.
    let text = templated(3_000);
    let (peak, trajectories) = plan_peak(&text);
    eprintln!("templated: {peak} bytes for {} bytes of suite", text.len());
    assert_eq!(trajectories, 3_000);
    assert!(
        peak < 15 * text.len(),
        "planning 3,000 templated scenarios ({} bytes of suite) held {peak} bytes",
        text.len()
    );
}

/// `trellis check` counts what cannot run without keeping the plan: the same counts as the
/// whole plan's, holding one scenario's plan at a time.
#[test]
fn counting_what_cannot_run_keeps_no_plan() {
    let _measuring = measuring();
    let text = flat(3_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("big.kdl");
    std::fs::write(&path, &text).expect("suite written");
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|e| panic!("{}", e.render_plain()));
    let everything = Selection {
        include_inactive: true,
        ..Selection::default()
    };
    let (whole, whole_peak) = peak_during(|| {
        Plan::build(&project, &everything)
            .expect("plan")
            .not_runnable()
    });
    let (counted, counted_peak) = peak_during(|| {
        Plan::count_not_runnable(&project, &everything, Default::default()).expect("counts")
    });
    eprintln!("counting: {counted_peak} bytes, the whole plan {whole_peak}");
    assert_eq!(counted, whole);
    assert_eq!(counted.trajectories, 3_000);
    // What stays is per-suite bookkeeping (the selection, the `needs` graph, the templates'
    // texts), not the plans of the scenarios.
    assert!(
        counted_peak * 2 < whole_peak,
        "counting held {counted_peak} bytes, the whole plan {whole_peak}"
    );
}

/// A `for-each` scenario's instances share their steps (`dsl/src/model.rs`), and their plans
/// share what the steps compile to: a row costs its own trajectories and scope, not a copy
/// of the scenario's execution tree.
#[test]
fn a_datasets_instances_share_their_execution_tree() {
    let _measuring = measuring();
    const ROWS: usize = 20_000;
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut csv = String::from("id,postal,item\n");
    for i in 0..ROWS {
        let _ = writeln!(csv, "o{i},V4T 0A7,duct cleaning");
    }
    std::fs::write(dir.path().join("rows.csv"), &csv).expect("dataset written");
    // The suite the loading test measures (`dsl/tests/load_memory.rs`).
    let text = include_str!("../../dsl/tests/memory/dataset_instances.kdl");
    let path = dir.path().join("ds.kdl");
    std::fs::write(&path, text).expect("suite written");
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|e| panic!("{}", e.render_plain()));
    let (plan, peak) = peak_during(|| Plan::build(&project, &Selection::default()).expect("plan"));
    assert_eq!(plan.trajectory_count(), 2 * ROWS as u64);
    let per_row = peak / ROWS;
    eprintln!("dataset: {peak} bytes for {ROWS} rows ({per_row} per row)");
    // 5,965 bytes when each instance compiled its own execution tree and checks.
    assert!(per_row < 1_500, "planning held {per_row} bytes per row");
    let (first, second) = (&plan.scenarios[0], &plan.scenarios[1]);
    assert!(Arc::ptr_eq(&first.nodes, &second.nodes));
    assert!(Arc::ptr_eq(&first.criteria, &second.criteria));
}
