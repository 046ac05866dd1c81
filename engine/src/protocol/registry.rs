//! THE list of protocols: one line per protocol module.
//!
//! Each protocol module declares its [`ProtocolSpec`] (name, endpoints, its own settings,
//! capabilities, builtin agents) and implements [`ProtocolModule`]: `plan` turns a decoded
//! agent into the protocol's own typed settings, `build` turns those into the agent's
//! [`AgentProtocol`]. The loader is handed [`specs`] (so `protocol="…"`, endpoints, settings
//! and builtin names are checked against them); the planner and the executor go through
//! [`module`] and ask capabilities, never a protocol's name. Adding a protocol is one module
//! and one line in [`PROTOCOLS`] (docs/architecture.md, "One protocol layer").

use std::any::Any;
use std::sync::Arc;

use trellis_dsl::lang::ProtocolSpec;
use trellis_dsl::{Agent, Project, Protocol};

use super::{AgentProtocol, AgentSetup, a2a, agentscope, connexity, fixie, jsonhttp, multiagent};
use crate::render::{CompiledTemplate, RenderError, Templates};

/// Every protocol Trellis speaks, in the order docs and diagnostics list them.
pub static PROTOCOLS: &[&dyn ProtocolModule] = &[
    &connexity::Module,
    &agentscope::Module,
    &multiagent::Module,
    &fixie::Module,
    &super::openai::OpenAiModule,
    &super::openai::AnthropicModule,
    &a2a::Module,
    &jsonhttp::Module,
];

/// The specs of [`PROTOCOLS`], as `trellis_dsl::load` takes them.
pub fn specs() -> Vec<&'static ProtocolSpec> {
    PROTOCOLS.iter().map(|m| m.spec()).collect()
}

/// The module of a protocol (every [`Protocol`] the loader accepted has one).
pub fn module(protocol: Protocol) -> Option<&'static dyn ProtocolModule> {
    PROTOCOLS
        .iter()
        .copied()
        .find(|m| m.spec().name == protocol.as_str())
}

/// A failure to build an agent's client, with the module's own error as text.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// One protocol: its spec, and the two steps from a decoded agent to a client.
pub trait ProtocolModule: Sync {
    fn spec(&self) -> &'static ProtocolSpec;

    /// The protocol's own settings of `agent`, typed, with their templates compiled.
    fn plan(
        &self,
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Arc<dyn PlannedSettings>, RenderError>;

    /// The client of one agent of a run, from its planned settings (`setup.agent.settings`).
    fn build(&self, setup: &AgentSetup<'_>) -> Result<Arc<dyn AgentProtocol>, BuildError>;

    /// Why a `ttft` check would have nothing to time on `agent` (it answers with one body);
    /// `trellis check` warns with it. By default: when the protocol never streams.
    fn untimed(&self, agent: &Agent) -> Option<String> {
        (!self.spec().capabilities.streams).then(|| one_body(agent))
    }
}

/// The `untimed` reason of an agent that answers with one JSON body.
pub fn one_body(agent: &Agent) -> String {
    format!(
        "agent `{}` ({}) answers with one JSON body: there is no first token to time; `ttft` \
         needs a streaming agent",
        agent.id.value,
        agent.protocol.as_str()
    )
}

/// A protocol's planned settings for one agent, as [`crate::plan::PlannedAgent::settings`]
/// carries them: opaque to the planner and the executor except for what they must know of
/// any agent.
pub trait PlannedSettings: std::fmt::Debug + Send + Sync {
    /// For the module's own `build`, to get its typed settings back ([`settings`]).
    fn as_any(&self) -> &dyn Any;

    /// `system-prompt`: rendered once per run with `env` in scope and handed to `build` as
    /// [`AgentSetup::system_prompt`].
    fn system_prompt(&self) -> Option<&CompiledTemplate> {
        None
    }

    /// How a `builtin=` agent is served when the agent says (`transport`, `process`); HTTP
    /// otherwise.
    fn builtin_serving(&self) -> (trellis_dsl::BuiltinTransport, trellis_dsl::ProcessMode) {
        Default::default()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("agent `{agent}`: its planned settings are not those of protocol `{protocol}`")]
pub struct ForeignSettings {
    agent: String,
    protocol: &'static str,
}

/// The typed settings module `T`'s `plan` made for the agent being built.
pub fn settings<'a, T: 'static>(setup: &'a AgentSetup<'_>) -> Result<&'a T, ForeignSettings> {
    setup
        .agent
        .settings
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| ForeignSettings {
            agent: setup.agent.id.to_string(),
            protocol: setup.agent.protocol.as_str(),
        })
}

/// Settings that are nothing but a copy of what the loader decoded (no template to compile).
macro_rules! planned_as_decoded {
    ($($ty:ty),*) => {$(
        impl PlannedSettings for $ty {
            fn as_any(&self) -> &dyn Any {
                self
            }
        }
    )*};
}
planned_as_decoded!(trellis_dsl::A2aSettings, Option<trellis_dsl::HttpSettings>);

impl PlannedSettings for trellis_dsl::MultiAgentSettings {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn builtin_serving(&self) -> (trellis_dsl::BuiltinTransport, trellis_dsl::ProcessMode) {
        (self.transport, self.process)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_is_listed_once_with_an_endpoint() {
        let specs = specs();
        for (i, spec) in specs.iter().enumerate() {
            assert!(
                specs[..i].iter().all(|s| s.name != spec.name),
                "`{}` is listed twice",
                spec.name
            );
            assert!(
                !spec.endpoints.is_empty(),
                "`{}` has no endpoint",
                spec.name
            );
            assert!(!spec.help.is_empty());
        }
    }
}
