# Trellis tasks. `just` lists them.

default:
    @just --list

# Run the example suites against the builtin agents; writes runs/<run-id>/
run *ARGS:
    cargo run --release -- run suites/ {{ARGS}}

# The test suite (what CI runs, with fmt and clippy)
test:
    cargo test --workspace

# Everything CI checks
ci:
    .ci/run

# Validate the example suites
check:
    cargo run -- check suites/

# The binary to hand out: the whole program optimized for size at link time (about 22 MB
# stripped; the release profile's is 28), a longer build; writes target/dist/trellis
dist:
    cargo build --profile dist

# Engine benchmark: 10,000 trajectories of 4 turns at --jobs 256
bench:
    cargo run --release -- bench --trajectories 10000 --jobs 256

# Fuzz the loader, templates and wire decoders: CASES generated inputs per property
fuzz CASES="1000000":
    TRELLIS_FUZZ_CASES={{CASES}} cargo test --release -p trellis-dsl --test it fuzz
    TRELLIS_FUZZ_CASES={{CASES}} cargo test --release -p trellis-engine --test it -- fuzz a2a_props never_panic
    TRELLIS_FUZZ_CASES={{CASES}} cargo test --release -p trellis-lsp props

# Rewrite the golden diagnostics after an intended change
bless:
    TRELLIS_BLESS=1 cargo test -p trellis-dsl --test it
