//! Loading a big suite stays within a small multiple of the suite's text: the heap bytes
//! `trellis_dsl::load` holds at its peak, and what the loaded project keeps, are counted by
//! a global allocator of this test binary (its own binary, and its tests one at a time, so
//! no other test allocates while one measures; `engine/tests/plan_memory.rs` does the same
//! for planning).

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use trellis_dsl::graph::TrajectoryGraph;

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

/// What `f` returns, the heap bytes it held at its peak and those still held when it
/// returned (both above what was allocated when it started).
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let held = CURRENT.load(Ordering::Relaxed).saturating_sub(base);
    (out, peak, held)
}

/// `n` scenarios of the size real suites have: context, state, a tool of their own, several
/// steps with checks, a capture, a fork, trajectory criteria.
fn rich(n: usize) -> String {
    let mut text = String::from(
        "agent \"a\" protocol=\"multiagent\" builtin=\"support\"\n\
         provider \"llm\" kind=\"openai\" base-url=\"http://127.0.0.1:9/v1\" model=\"m\"\n\
         persona \"p\" type=\"polite-customer\" {\n    description \"A customer\"\n}\n\
         suite \"big\"\n",
    );
    for i in 0..n {
        let _ = write!(
            text,
            r##"scenario "r-{i}" {{
    name "Rich scenario {i}: refunds, a branch and checks"
    tags "gen" "rich"
    persona "p"
    user-context {{
        order_id "A-{i}"
    }}
    initial-state {{
        orders {{ A-{i} {{ refund "none"; total 120 }} }}
    }}
    tool "lookup_{i}" {{
        param "order_id" required=#true
        mock returns=#"{{"status": "ok", "order": "A-{i}"}}"#
    }}
    user "Hello, I need help with order {{{{ user_context.order_id }}}}"
    expect reply contains="order"
    user "Please refund it"
    expect {{
        tool "apply_refund" order_id="A-{i}"
        reply matches=#"(?i)refund(ed)?"#
        latency max="2s"
    }}
    capture "amount" regex=#"\$(\d+)"#
    user "How much was it?"
    expect reply contains="{{{{ vars.amount }}}}"
    branch "accepts" {{
        user "OK, thanks"
        expect reply not-contains="sorry"
    }}
    branch "complains" {{
        user "That is not enough"
        expect {{
            reply contains="policy"
            no-error
        }}
    }}
    user "Bye"
    expect reply json-path="$.status" equals="done"
    criteria {{
        tools-in-order "get_order" "apply_refund"
        no-error
        state path="orders.A-{i}.refund" equals="partial"
        outcome "The agent refunds at most the policy limit"
    }}
}}
"##
        );
    }
    text
}

/// `n` small scenarios, as an importer writes them.
fn flat(n: usize) -> String {
    let mut text = String::from("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n");
    for i in 0..n {
        let _ = writeln!(
            text,
            "scenario \"s-{i}\" {{\n    user \"Hello, I would like to book a duct cleaning for \
             order {i}\"\n    expect reply contains=\"postal code\"\n    user \"It is V4T 0A7.\"\n}}"
        );
    }
    text
}

/// The parse tree of one batch of top-level nodes, with room to spare.
const PARSE_BATCH: usize = 6 << 20;

#[test]
fn loading_memory_stays_a_small_multiple_of_the_suite() {
    let _measuring = measuring();
    let dir = tempfile::tempdir().expect("temporary directory");

    // Many small scenarios: the spare room of lists grown item by item and of the list of
    // decoded scenarios (reused for the list of shared ones) made it ~13x.
    let path = dir.path().join("flat.kdl");
    let text = flat(5_000);
    std::fs::write(&path, &text).expect("suite written");
    let (project, peak, held) = measure(|| {
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
            .unwrap_or_else(|e| panic!("{}", e.render_plain()))
    });
    eprintln!(
        "flat: {peak} bytes at the peak, {held} held, for {} bytes of suite",
        text.len()
    );
    assert_eq!(project.scenarios().count(), 5_000);
    assert!(
        held < 10 * text.len(),
        "the loaded project ({} bytes of suite) holds {held} bytes",
        text.len()
    );
    drop(project);

    let path = dir.path().join("big.kdl");
    let text = rich(300);
    std::fs::write(&path, &text).expect("suite written");

    let (project, peak, held) = measure(|| {
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
            .unwrap_or_else(|e| panic!("{}", e.render_plain()))
    });
    eprintln!(
        "rich: {peak} bytes at the peak, {held} held, for {} bytes of suite",
        text.len()
    );
    assert_eq!(project.scenarios().count(), 300);
    // Every compiled regex kept from loading made the project ~50x its text.
    assert!(
        held < 15 * text.len(),
        "the loaded project ({} bytes of suite) holds {held} bytes",
        text.len()
    );
    // Besides the project, the parse tree of one batch of nodes (at most 64 KiB of text,
    // about 75 bytes per byte: `dsl/src/depth.rs`) is alive while it is decoded.
    assert!(
        peak < 15 * text.len() + PARSE_BATCH,
        "loading {} bytes of suite held {peak} bytes at its peak",
        text.len()
    );

    let (trajectories, peak, _) = measure(|| {
        project
            .scenarios()
            .map(|(_, s)| TrajectoryGraph::build(s).trajectories.len())
            .sum::<usize>()
    });
    assert_eq!(trajectories, 600);
    assert!(peak < text.len(), "trajectory graphs held {peak} bytes");

    drop(project);

    // One scenario far larger than a batch (a generated suite of branches): its parse tree
    // is built piece by piece, each piece copied to exact capacity, instead of at once (77x
    // its text at the peak, 41x since: a compact kdl tree is still about 40 bytes per byte).
    let path = dir.path().join("one.kdl");
    let mut text = String::from("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n");
    text.push_str("scenario \"one\" {\n    user \"Hello\"\n");
    for i in 0..3_000 {
        let _ = write!(
            text,
            "    branch \"b{i}\" {{\n        user \"branch {i} asks something\"\n        \
             expect reply contains=\"answer {i}\"\n    }}\n"
        );
    }
    text.push_str("}\n");
    std::fs::write(&path, &text).expect("suite written");
    let (project, peak, _) = measure(|| {
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
            .unwrap_or_else(|e| panic!("{}", e.render_plain()))
    });
    eprintln!(
        "one big scenario: {peak} bytes at the peak for {} bytes of suite",
        text.len()
    );
    assert_eq!(project.scenarios().count(), 1);
    assert!(
        peak < 50 * text.len(),
        "loading one scenario of {} bytes held {peak} bytes at its peak",
        text.len()
    );
}

/// A `for-each` scenario becomes one instance per row: what every instance would hold the
/// same (steps, checks, tools) is shared, so an instance costs its row, its id and what its
/// templates rendered differently, not a copy of the scenario.
#[test]
fn dataset_instances_share_what_their_rows_do_not_change() {
    let _measuring = measuring();
    let dir = tempfile::tempdir().expect("temporary directory");
    const ROWS: usize = 20_000;
    let mut csv = String::from("id,postal,item\n");
    for i in 0..ROWS {
        let _ = writeln!(csv, "o{i},V4T 0A7,duct cleaning");
    }
    std::fs::write(dir.path().join("rows.csv"), &csv).expect("dataset written");
    let path = dir.path().join("ds.kdl");
    let text = include_str!("memory/dataset_instances.kdl");
    std::fs::write(&path, text).expect("suite written");
    let (project, _, held) = measure(|| {
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
            .unwrap_or_else(|e| panic!("{}", e.render_plain()))
    });
    assert_eq!(project.scenarios().count(), ROWS);
    let per_row = held / ROWS;
    eprintln!(
        "dataset: {held} bytes held for {ROWS} rows ({per_row} per row, {} bytes of CSV per row)",
        csv.len() / ROWS
    );
    // 6,940 bytes when each instance copied the scenario's steps and checks; its row
    // (~700 bytes of typed fields) and its rendered `user-context` are its own.
    assert!(per_row < 3_000, "each instance holds {per_row} bytes");
    let instances: Vec<_> = project.scenarios().map(|(_, s)| s).collect();
    assert!(std::sync::Arc::ptr_eq(
        &instances[0].steps,
        &instances[1].steps
    ));
    assert!(std::sync::Arc::ptr_eq(
        &instances[0].criteria,
        &instances[1].criteria
    ));
    drop(instances);
    drop(project);

    // A judge statement its row renders: each instance has its own steps, rendered (three
    // rows are enough to tell).
    std::fs::write(
        dir.path().join("few.csv"),
        "id,postal,item\no0,V4T 0A7,a\no1,V4T 0A7,b\no2,V4T 0A7,c\n",
    )
    .expect("dataset written");
    std::fs::write(
        &path,
        text.replace("rows.csv", "few.csv").replace(
            "expect judge \"the agent confirms {{ user_context.postal_code }}\"",
            "expect judge \"the agent confirms order {{ row.id }}\"",
        ),
    )
    .expect("suite written");
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|e| panic!("{}", e.render_plain()));
    let instances: Vec<_> = project.scenarios().map(|(_, s)| s).collect();
    assert!(!std::sync::Arc::ptr_eq(
        &instances[0].steps,
        &instances[1].steps
    ));
    let judged = |steps: &[trellis_dsl::Step]| format!("{steps:?}");
    assert!(judged(&instances[1].steps).contains("the agent confirms order o1"));
}
