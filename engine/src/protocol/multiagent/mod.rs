//! The MultiAgentEval protocol (`protocol="multiagent"`, docs/wire.md, "MultiAgentEval"):
//! agents that answer every request with an action, in an action loop the harness drives.
//!
//! [`wire`] is the codec: requests in both generations, replies decoded into typed actions,
//! agent name discovery and the final text for criteria. [`session`] runs the action loop
//! over HTTP (`POST /execute_task`), processes and sockets ([`crate::transport::line`]), answers tool
//! calls from the trajectory's [`crate::sandbox::Sandbox`] and feeds the results back, and
//! handles HITL pauses. Branch actions are a fault until the executor explores them, and
//! plans still mark the protocol unsupported until the suite language and the executor
//! are wired to it.

pub mod session;
pub mod wire;
