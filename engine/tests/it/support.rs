//! The shared test support ([`trellis_testkit`]), under the name the tests use.

pub use trellis_testkit::*;
