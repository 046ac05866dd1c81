//! The deterministic "model" behind the two model builtins, `clerk` (OpenAI chat completions,
//! [`crate::openai`]) and `concierge` (Anthropic Messages, [`crate::anthropic`]): an order
//! desk that looks orders up with a `get_order` tool.
//!
//! Both wire formats are decoded into the same [`Message`]s and the answer is decided here,
//! from the conversation the request carries alone (a real model keeps nothing between
//! requests either), so the two builtins answer alike and a fork of a conversation needs
//! nothing from the server. What it answers:
//!
//! - after a round of tool results: one sentence per result (`Order A-1001 is shipped.`,
//!   `I could not find order A-9.`, else the result quoted);
//! - to a user message naming an order (`A-1001`, letters, `-`, digits): a `get_order` call
//!   with `{"order_id": …}` when the request offers that tool, else a sentence saying it
//!   has no tool to look orders up with;
//! - `what did I ask`: the earlier user messages, joined with ` | ` (so a history the client
//!   did not resend shows);
//! - a greeting (`hi`, `hello`, `hey`), or no user message at all (the model speaks first):
//!   its greeting;
//! - anything else: `Echo: TEXT`.
//!
//! Token counts are words, so `tokens` checks have deterministic numbers to compare.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Value, json};

/// The tool the model calls to look an order up.
pub const ORDER_TOOL: &str = "get_order";

/// What the model says first, and to a greeting.
pub const GREETING: &str =
    "Hello! I can look up an order for you: tell me its number, like A-1001.";

static ORDER_ID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b([A-Z]{1,3}-\d{1,9})\b").expect("the order id pattern is a valid regex")
});

static GREETING_WORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^\s*(hi|hello|hey)\b").expect("the greeting pattern is a valid regex")
});

/// One message of the conversation, whichever API carried it.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    User(String),
    Assistant,
    /// A tool's result: the tool's name when the wire says it, and the result's text.
    ToolResult {
        name: Option<String>,
        content: String,
    },
}

/// The model's answer: text, tool calls, or both.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reply {
    pub text: Option<String>,
    pub tool_calls: Vec<Call>,
}

/// A tool call the model makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: Value,
}

impl Reply {
    fn text(text: impl Into<String>) -> Self {
        Reply {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        }
    }
}

/// The answer to `messages` (oldest first) when the request offers the tools `offered`.
pub fn answer(messages: &[Message], offered: &[String]) -> Reply {
    // The results of the last round of tool calls, when the conversation ends with them.
    let results: Vec<(&Option<String>, &str)> = messages
        .iter()
        .rev()
        .map_while(|m| match m {
            Message::ToolResult { name, content } => Some((name, content.as_str())),
            _ => None,
        })
        .collect();
    if !results.is_empty() {
        let sentences: Vec<String> = results
            .into_iter()
            .rev()
            .map(|(name, content)| describe_result(name.as_deref(), content))
            .collect();
        return Reply::text(sentences.join(" "));
    }
    let users: Vec<&str> = messages
        .iter()
        .filter_map(|m| match m {
            Message::User(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let Some(last) = users.last().copied() else {
        return Reply::text(GREETING);
    };
    if let Some(id) = ORDER_ID.captures(last).and_then(|c| c.get(1)) {
        let id = id.as_str();
        if !offered.iter().any(|t| t == ORDER_TOOL) {
            return Reply::text(format!(
                "I have no tool to look up order {id} with: offer me `{ORDER_TOOL}`."
            ));
        }
        return Reply {
            text: None,
            tool_calls: vec![Call {
                name: ORDER_TOOL.to_owned(),
                arguments: json!({ "order_id": id }),
            }],
        };
    }
    if last.to_lowercase().contains("what did i ask") {
        let earlier = &users[..users.len() - 1];
        return Reply::text(if earlier.is_empty() {
            "You have not asked anything before.".to_owned()
        } else {
            format!("You asked: {}", earlier.join(" | "))
        });
    }
    if GREETING_WORD.is_match(last) {
        return Reply::text(GREETING);
    }
    Reply::text(format!("Echo: {last}"))
}

/// One sentence about a tool result: an order's status when the result is one, else the
/// result quoted.
fn describe_result(name: Option<&str>, content: &str) -> String {
    let value: Option<Value> = serde_json::from_str(content).ok();
    let field = |key: &str| {
        value
            .as_ref()
            .and_then(|v| v.get(key))
            .and_then(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    };
    match (field("order_id"), field("status")) {
        (Some(id), Some(status)) if status == "not_found" => {
            format!("I could not find order {id}.")
        }
        (_, Some(status)) if status == "not_found" => "I could not find that order.".to_owned(),
        (Some(id), Some(status)) => format!("Order {id} is {status}."),
        _ => format!("The {} tool answered: {content}", name.unwrap_or("lookup")),
    }
}

/// Words in `text`: the model's token count.
pub fn tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The words of `text` with their spaces, as a model streams them.
pub fn pieces(text: &str) -> Vec<&str> {
    text.split_inclusive(' ').collect()
}

/// The arguments' JSON text cut in two, as a model streams a call's arguments.
pub fn argument_pieces(arguments: &Value) -> (String, String) {
    let text = arguments.to_string();
    let middle = text.len() / 2;
    // JSON text of a call is ASCII here, but cut on a character boundary whatever it holds.
    let cut = (middle..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    let (head, tail) = text.split_at(cut);
    (head.to_owned(), tail.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::User(text.to_owned())
    }

    #[test]
    fn an_order_is_looked_up_then_described() {
        let offered = vec![ORDER_TOOL.to_owned()];
        let first = answer(&[user("Where is order A-1001?")], &offered);
        assert_eq!(first.text, None);
        assert_eq!(first.tool_calls[0].arguments, json!({"order_id": "A-1001"}));
        let second = answer(
            &[
                user("Where is order A-1001?"),
                Message::Assistant,
                Message::ToolResult {
                    name: Some(ORDER_TOOL.into()),
                    content: r#"{"order_id": "A-1001", "status": "shipped"}"#.into(),
                },
            ],
            &offered,
        );
        assert_eq!(second.text.as_deref(), Some("Order A-1001 is shipped."));
        // Without the tool, it says so instead of calling it.
        let refused = answer(&[user("Where is order A-1001?")], &[]);
        assert!(refused.text.unwrap().contains("no tool"));
    }

    #[test]
    fn greets_echoes_and_recalls() {
        assert_eq!(answer(&[], &[]).text.as_deref(), Some(GREETING));
        assert_eq!(answer(&[user("Hi!")], &[]).text.as_deref(), Some(GREETING));
        assert_eq!(
            answer(&[user("ping")], &[]).text.as_deref(),
            Some("Echo: ping")
        );
        let recalled = answer(
            &[user("one"), Message::Assistant, user("What did I ask?")],
            &[],
        );
        assert_eq!(recalled.text.as_deref(), Some("You asked: one"));
        assert_eq!(
            describe_result(Some("x"), "not json"),
            "The x tool answered: not json"
        );
    }

    #[test]
    fn arguments_split_into_two_pieces_that_join_back() {
        let args = json!({"order_id": "A-1001"});
        let (head, tail) = argument_pieces(&args);
        assert_eq!(format!("{head}{tail}"), args.to_string());
        assert!(!head.is_empty() && !tail.is_empty());
    }
}
