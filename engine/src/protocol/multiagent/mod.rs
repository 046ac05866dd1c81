//! The MultiAgentEval protocol (`protocol="multiagent"`, specs/multiagent-eval-agent-api.txt):
//! agents that answer every request with an action, in an action loop the harness drives.
//!
//! Only the wire codec exists so far ([`wire`]): requests in both generations, replies
//! decoded into typed actions, agent name discovery and the final text for criteria. The
//! session comes next: it runs the loop over HTTP (`POST /execute_task`), processes and
//! sockets ([`super::line`]), feeds tool results back from the sandbox through
//! [`wire::Dialogue::continue_with`], and answers HITL pauses and branches. Until then the
//! protocol is not built by [`super::build`] and plans mark it unsupported.

pub mod wire;
