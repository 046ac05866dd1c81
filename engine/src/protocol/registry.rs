//! THE list of protocols: one line per protocol module.
//!
//! Each protocol module declares its [`ProtocolSpec`] (name, endpoints, its own settings,
//! capabilities, builtin agents) and implements [`ProtocolModule`]: `plan` turns a decoded
//! agent into the protocol's own typed settings, `build` turns those into the agent's
//! [`AgentProtocol`]. The loader is handed [`specs`] (so `protocol="…"`, endpoints, settings
//! and builtin names are checked against them); the planner and the executor go through
//! [`module`] and ask capabilities, never a protocol's name. Adding a protocol is one module
//! and one line in [`PROTOCOLS`] (docs/architecture.md, "Key decisions").

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
    &super::openai::Module,
    &super::anthropic::Module,
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

    /// The client of one agent of a run, from its planned settings (`setup.settings`).
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

/// A protocol's planned settings for one agent, as `PlannedAgent::settings` (the planner's)
/// carries them: opaque to the planner and the executor except for what they must know of
/// any agent.
pub trait PlannedSettings: std::fmt::Debug + Send + Sync {
    /// For the module's own `build`, to get its typed settings back ([`settings`]).
    fn as_any(&self) -> &dyn Any;

    /// `system-prompt`: rendered once per run with `env` in scope and handed to `build` as
    /// [`AgentSetup::system_prompt`], unless it reads the turn's variables
    /// (`PlannedAgent::system_prompt_per_turn`): then rendered for each turn and sent as
    /// `CallContext::system_prompt`.
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
        .settings
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| ForeignSettings {
            agent: setup.id.to_owned(),
            protocol: setup.protocol.as_str(),
        })
}

/// A module's settings decoded with serde from the agent's settings as written: the loader
/// checked the values against the module's spec, so the default stands in only for what is
/// not written.
pub fn decoded<T>(agent: &Agent) -> Arc<dyn PlannedSettings>
where
    T: serde::de::DeserializeOwned + Default + PlannedSettings + 'static,
{
    Arc::new(agent.settings.decode::<T>().unwrap_or_default())
}

/// The protocol table of docs/protocols.md, written from the registry (a test keeps the file
/// in step with it).
pub fn markdown_table() -> String {
    let code = |s: &str| format!("`{s}`");
    let mut out = String::from(
        "| protocol | endpoints | its own settings | builtin agents | can | what it is |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in specs() {
        let endpoints: Vec<String> = spec
            .endpoints
            .iter()
            .map(|e| code(&format!("{}=", e.property())))
            .collect();
        let settings: Vec<String> = spec
            .settings
            .iter()
            .map(|s| match (s.form, s.args.first()) {
                (trellis_dsl::lang::Form::Setting, Some(arg)) => {
                    format!("{} ({})", code(s.name), arg.ty.describe())
                }
                _ => code(&s.usage()),
            })
            .collect();
        let builtins: Vec<String> = spec.builtins.iter().map(|b| code(b)).collect();
        let c = spec.capabilities;
        let can: Vec<&str> = [
            (c.streams, "stream"),
            (c.forks, "fork by copying"),
            (c.session_bound, "session on the server"),
            (c.engine_runs_tools, "sandbox tools"),
            (c.model_api, "model under test"),
            (c.speaks_first, "speak first"),
            (c.function_calls, "`call` steps"),
            (c.pauses, "pause for a human"),
            (c.agent_branches, "branch itself"),
            (c.provider_plays_llm, "LLM played by a provider"),
            (c.carries_tool_mocks, "mock tool answers"),
        ]
        .into_iter()
        .filter_map(|(has, what)| has.then_some(what))
        .collect();
        let or_none = |v: Vec<String>| {
            if v.is_empty() {
                "—".to_owned()
            } else {
                v.join(", ")
            }
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            code(spec.name),
            endpoints.join(", "),
            or_none(settings),
            or_none(builtins),
            can.join(", "),
            spec.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- registry table: begin -->\n";
    const END: &str = "<!-- registry table: end -->";

    /// docs/protocols.md shows the registry as it is; `TRELLIS_BLESS=1` rewrites the table.
    #[test]
    fn the_docs_protocol_table_is_the_registry() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/protocols.md");
        let text = std::fs::read_to_string(&path).expect("docs/protocols.md is readable");
        let (Some(start), Some(end)) = (text.find(BEGIN), text.find(END)) else {
            panic!("docs/protocols.md lacks the registry table markers");
        };
        let written = &text[start + BEGIN.len()..end];
        let table = markdown_table();
        if written != table {
            if std::env::var_os("TRELLIS_BLESS").is_some_and(|v| v == "1") {
                let updated = format!("{}{table}{}", &text[..start + BEGIN.len()], &text[end..]);
                std::fs::write(&path, updated).expect("docs/protocols.md is writable");
                return;
            }
            panic!(
                "docs/protocols.md's table differs from the registry; rerun with \
                 TRELLIS_BLESS=1 to rewrite it. Expected:\n{table}"
            );
        }
    }

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
