//! The engine's integration tests, in one binary so the crate links once.

mod a2a;
mod a2a_props;
mod agentscope;
mod builtin_booking;
mod builtin_support;
mod criterion_templates;
mod execution;
mod fixie;
mod fixie_llm;
mod fuzz;
mod jsonhttp;
mod judging;
mod layers;
mod line;
mod llm;
mod multiagent;
mod multiagent_run;
mod openai;
mod planning;
mod protocol;
mod provider_agents;
mod reuse;
mod simulating;
mod support;
