//! The simulated user: an LLM playing the persona writes the user side of `simulate` steps.
//!
//! It is told the persona (type, description, instructions), the user context as JSON (as
//! Connexity's prompt builder writes it), the scenario's description and the suite's
//! `simulator instructions`, and sees the conversation so far with the roles turned around
//! (its own messages as `assistant`, the agent's replies as `user`). It ends the
//! conversation by writing [`END_MARKER`]: alone (nothing more is sent) or after its last
//! message (that message is sent, then the simulation stops).
//!
//! An empty answer, or one that is only a role prefix, is asked again (with a note saying
//! so, which makes the retry a different request for the cache) up to
//! [`SIMULATOR_RETRIES`] times; then the trajectory gets a `simulator` fault.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::judge::PersonaInfo;
use super::{LlmMessage, LlmRequest};
use crate::record::TurnRecord;

/// What the simulated user writes to end the conversation.
pub const END_MARKER: &str = "[END]";

/// Retries of an empty or malformed simulator answer before the trajectory faults.
pub const SIMULATOR_RETRIES: usize = 2;

/// Turns a `simulate until-done` takes at most when the scenario sets no `max-turns`.
pub const UNTIL_DONE_CAP: u32 = 20;

/// Tools an agent calls to end the conversation itself: Connexity's voice agents hang up with
/// an `end_call` tool. A turn with such a call ends the `simulate` step after that turn.
pub const AGENT_END_TOOLS: &[&str] = &["end_call", "end_conversation"];

/// Whether the agent ended the conversation in this turn (called one of [`AGENT_END_TOOLS`]).
pub fn agent_ended(turn: &TurnRecord) -> bool {
    turn.tool_calls
        .iter()
        .any(|call| AGENT_END_TOOLS.contains(&call.name.as_str()))
}

/// What the simulator knows about the user it plays.
#[derive(Clone, Debug, Default)]
pub struct Character<'a> {
    pub persona: Option<PersonaInfo>,
    pub user_context: Option<&'a Map<String, Value>>,
    pub description: Option<&'a str>,
    /// The suite's `simulator instructions`, rendered.
    pub instructions: Option<String>,
}

/// The simulator's request for the next user message. `retry` (0 for the first ask) adds a
/// note about the previous unusable answer.
pub fn request<T: AsRef<TurnRecord>>(
    character: &Character<'_>,
    turns: &[T],
    retry: usize,
) -> LlmRequest {
    let mut system = String::from(
        "You are role-playing the USER in a conversation with an AI agent, to test the agent. \
         Stay in character. Write only the user's next message: plain text as the user would \
         type it, no quotes, no role name, no commentary.\n",
    );
    if let Some(p) = &character.persona {
        let _ = writeln!(system, "\nYour persona: {}", p.kind);
        if let Some(d) = &p.description {
            let _ = writeln!(system, "Who you are: {d}");
        }
        if let Some(i) = &p.instructions {
            let _ = writeln!(system, "How you behave: {i}");
        }
    }
    if let Some(uc) = character.user_context.filter(|m| !m.is_empty()) {
        let _ = writeln!(
            system,
            "\nWhat you know (user context, JSON):\n{}",
            serde_json::to_string_pretty(uc).unwrap_or_default()
        );
    }
    if let Some(d) = character.description {
        let _ = writeln!(system, "\nThe situation: {d}");
    }
    if let Some(i) = &character.instructions {
        let _ = writeln!(system, "\n{i}");
    }
    let _ = write!(
        system,
        "\nWhen your goal is reached or the conversation is over, write {END_MARKER} (alone, or \
         at the end of your last message)."
    );
    let mut messages = vec![LlmMessage::system(system)];
    for t in turns.iter().map(AsRef::as_ref) {
        if !t.user_message.is_empty() {
            messages.push(LlmMessage::assistant(t.user_message.clone()));
        }
        messages.push(LlmMessage::user(
            t.reply.clone().unwrap_or_else(|| "(no answer)".to_owned()),
        ));
    }
    if messages.len() == 1 {
        messages.push(LlmMessage::user(
            "(The conversation starts: write your first message to the agent.)",
        ));
    }
    if retry > 0 {
        messages.push(LlmMessage::user(format!(
            "(Your previous answer was empty or not a message (retry {retry}). Write the user's \
             next message, or {END_MARKER}.)"
        )));
    }
    LlmRequest {
        messages,
        ..LlmRequest::default()
    }
}

/// What the simulator's answer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Said {
    /// Send this message and go on.
    Message(String),
    /// Send this message, then end the conversation.
    Last(String),
    /// End the conversation without another message.
    End,
    /// Nothing usable: ask again.
    Unusable,
}

/// Reads the simulator's answer: role prefixes and wrapping quotes removed, the end marker
/// found anywhere.
pub fn interpret(text: &str) -> Said {
    let ended = text.contains(END_MARKER);
    let without = text.replace(END_MARKER, " ");
    let mut message = without.trim();
    for prefix in ["User:", "USER:", "user:", "Customer:", "Me:"] {
        if let Some(rest) = message.strip_prefix(prefix) {
            message = rest.trim();
        }
    }
    let message = message
        .strip_prefix('"')
        .and_then(|m| m.strip_suffix('"'))
        .unwrap_or(message)
        .trim();
    match (message.is_empty(), ended) {
        (true, true) => Said::End,
        (true, false) => Said::Unusable,
        (false, true) => Said::Last(message.to_owned()),
        (false, false) => Said::Message(message.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_cleaned_and_the_end_marker_is_found() {
        assert_eq!(
            interpret("User: \"Hi there\""),
            Said::Message("Hi there".into())
        );
        assert_eq!(
            interpret("Thanks, bye! [END]"),
            Said::Last("Thanks, bye!".into())
        );
        assert_eq!(interpret(" [END] "), Said::End);
        assert_eq!(interpret("User:"), Said::Unusable);
        assert_eq!(interpret("   "), Said::Unusable);
    }

    #[test]
    fn roles_are_turned_around_and_a_retry_is_another_request() {
        let turn = TurnRecord {
            user_message: "Hi".into(),
            reply: Some("Hello, how can I help?".into()),
            ..TurnRecord::default()
        };
        let character = Character {
            persona: Some(PersonaInfo {
                kind: "busy-parent".into(),
                description: None,
                instructions: Some("Be brief".into()),
            }),
            ..Character::default()
        };
        let first = request(&character, std::slice::from_ref(&turn), 0);
        let roles: Vec<_> = first.messages.iter().map(|m| m.role).collect();
        use super::super::Role::*;
        assert_eq!(roles, [System, Assistant, User]);
        assert!(first.messages[0].content.contains("Be brief"));
        assert!(first.messages[0].content.contains(END_MARKER));
        assert_ne!(request(&character, &[turn], 1), first);
        let opening = request(&character, &[] as &[TurnRecord], 0);
        assert_eq!(opening.messages.last().map(|m| m.role), Some(User));
    }
}
