//! The engine's integration tests, in one binary so the crate links once.

mod builtin_booking;
mod execution;
mod fixie;
mod line;
mod protocol;
mod support;
