//! Links `trellis` as a position-dependent executable on Linux (glibc): see
//! docs/performance.md, "What was slow, and why it is not any more".
//!
//! A position-independent executable is relocated at every start: the dynamic loader writes
//! about 90,000 addresses into 2 MB of `.data.rel.ro`, which costs some 500 page faults —
//! half of all the faults of a one-trajectory run, and most of `trellis --version`'s time
//! on a virtual machine. A position-dependent one has them resolved by the linker. What is
//! given up is the randomized load address of the executable itself (shared libraries,
//! the stack and the heap are still randomized). `TRELLIS_PIE=1` at build time keeps the
//! default (PIE).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TRELLIS_PIE");
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    let pie_asked = std::env::var_os("TRELLIS_PIE").is_some_and(|v| !v.is_empty() && v != "0");
    if linux_gnu && !pie_asked {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
