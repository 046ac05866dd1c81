//! The engine's integration tests, in one binary so the crate links once.

mod agentscope;
mod builtin_booking;
mod execution;
mod protocol;
mod support;
