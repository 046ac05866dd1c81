//! A scenario's `history`: a recorded conversation that opens every trajectory as if it
//! had happened. A session that holds its conversation takes it as turns already taken
//! ([`Session::restore`], as `trellis watch` rebuilds a recorded prefix), so the agent
//! receives it as history with the first real request; a session bound to server state
//! gets the history's user messages replayed one turn at a time, as the executor replays a
//! shared prefix at a fork.

use serde_json::Value;

use crate::protocol::{Session, Turn, TurnInput};
use crate::record::ChatMessage;

/// The history as turns: each user message (`None`: the agent's opening, messages before
/// any user message) with what the agent answered, its messages and final text. System
/// messages are left out: an agent's instructions are its own.
pub(super) fn turns(messages: &[Value]) -> Vec<(Option<String>, Turn)> {
    let mut out: Vec<(Option<String>, Turn)> = Vec::new();
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let content = m.get("content").and_then(Value::as_str);
        match role {
            "user" => out.push((
                Some(content.unwrap_or_default().to_string()),
                Turn::default(),
            )),
            "assistant" | "tool" => {
                if out.is_empty() {
                    out.push((None, Turn::default()));
                }
                if let Some((_, turn)) = out.last_mut() {
                    turn.messages.push(message(m, role, content));
                    if role == "assistant" && content.is_some_and(|c| !c.is_empty()) {
                        turn.reply = content.map(str::to_string);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A message as the protocols keep it; one whose tool calls are not of the OpenAI shape
/// keeps its role and text.
fn message(m: &Value, role: &str, content: Option<&str>) -> ChatMessage {
    serde_json::from_value(m.clone()).unwrap_or_else(|_| ChatMessage {
        role: role.to_string(),
        content: content.map(str::to_string),
        ..ChatMessage::default()
    })
}

/// Gives `session` the history as turns it has taken; `false` when its protocol keeps the
/// conversation on the agent's side (the caller replays the user turns).
pub(super) fn restore(session: &mut dyn Session, turns: &[(Option<String>, Turn)]) -> bool {
    let pairs: Vec<(TurnInput<'_>, &Turn)> = turns
        .iter()
        .map(|(input, turn)| {
            let input = input.as_deref().map_or(TurnInput::Opening, TurnInput::User);
            (input, turn)
        })
        .collect();
    session.restore(&pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_group_into_turns_by_user_message() {
        let messages: Vec<Value> = serde_json::from_str(
            r#"[{"role": "system", "content": "be nice"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "{}", "tool_call_id": "c1"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "bye"}]"#,
        )
        .unwrap();
        let turns = turns(&messages);
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[0].0, None);
        assert_eq!(turns[0].1.reply.as_deref(), Some("Hello!"));
        assert_eq!(turns[1].0.as_deref(), Some("hi"));
        assert_eq!(turns[1].1.messages.len(), 3);
        assert_eq!(turns[1].1.messages[0].tool_calls.len(), 1);
        assert_eq!(turns[1].1.reply.as_deref(), Some("done"));
        assert_eq!(turns[2].0.as_deref(), Some("bye"));
        assert!(turns[2].1.reply.is_none());
    }
}
