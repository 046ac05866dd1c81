//! The engine's integration tests, in one binary so the crate links once.

mod builtin_booking;
mod execution;
mod line;
mod protocol;
mod support;
