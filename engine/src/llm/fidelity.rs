//! Simulator fidelity: whether the simulated user stayed in character, so that a broken
//! simulator is never charged to the agent.
//!
//! Three layers, cheapest first (docs/simulator.md):
//!
//! - **Guards** ([`guard`]), deterministic and run on every simulated message before it is
//!   sent: an empty message (after the simulator's own retries), a message in the agent's
//!   voice (a copy of one of the agent's replies, or a phrase only a service agent says), a
//!   repeat of the previous user message.
//! - **Cycles** ([`cycle`]): the same user and agent messages again, turn for turn; the
//!   conversation stops when the second cycle completes instead of running to `max-turns`.
//! - **The fidelity judge** ([`request`], [`parse`]): a judge reads only the simulated
//!   user's messages against the persona, its instructions, the user context and the
//!   scenario, and answers whether the simulator broke character.
//!
//! Each finding is a [`FIDELITY_KIND`] check on the trajectory: failed, it makes the
//! trajectory `invalid`. Small local models are the expected simulators and judges, so the
//! judge's prompt is short and asks for a two-field JSON object, and the answer is read
//! leniently (JSON anywhere, `key: value` lines, or a leading yes/no).

use serde_json::{Value, json};

use super::{LlmMessage, LlmRequest};
pub use crate::record::FIDELITY_KIND;
use crate::record::TurnRecord;

/// The `criterion` text of every fidelity check.
pub const CRITERION: &str = "simulator fidelity";

/// Phrases a service agent says and a user does not (lower case). Deliberately few and
/// specific: a false positive throws away a good trajectory.
const AGENT_PHRASES: &[&str] = &[
    "how can i help you",
    "how may i help you",
    "how can i assist you",
    "how may i assist you",
    "is there anything else i can help",
    "is there anything else i can do for you",
    "thank you for contacting",
    "thanks for contacting",
    "thank you for reaching out",
    "i will proceed with the",
    "i'll proceed with the",
    "let me check that for you",
    "i have processed your",
    "i've processed your",
];

/// A message reduced to what matters for comparing: lower case, words only.
pub fn normalize(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a simulated message breaks character before it is sent, if it does. `previous_user`:
/// the last user message on the path; `replies`: the agent's replies so far.
pub fn guard<'a>(
    message: &str,
    previous_user: Option<&str>,
    replies: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let norm = normalize(message);
    if norm.is_empty() {
        return Some("empty message: the simulated user wrote nothing".to_owned());
    }
    if previous_user.is_some_and(|p| normalize(p) == norm) {
        return Some(format!(
            "repeat: the simulated user sent its previous message again: {}",
            quote(message)
        ));
    }
    if replies.into_iter().any(|r| normalize(r) == norm) {
        return Some(format!(
            "agent's voice: the simulated user copied one of the agent's replies: {}",
            quote(message)
        ));
    }
    if let Some(phrase) = AGENT_PHRASES.iter().find(|p| norm.contains(&normalize(p))) {
        return Some(format!(
            "agent's voice: the simulated user spoke as the agent (\"{phrase}\"): {}",
            quote(message)
        ));
    }
    None
}

/// A conversation that repeats itself: when the last `k` turns are, user message and agent
/// reply alike, the `k` turns before them, returns `(k, first)` where `first` is the index
/// of the first turn of the repeated block (so turns `first..first+k` came back as
/// `first+k..first+2k`). The shortest period wins.
pub fn cycle<T: AsRef<TurnRecord>>(turns: &[T]) -> Option<(usize, usize)> {
    let n = turns.len();
    let key = |t: &T| {
        let t = t.as_ref();
        (
            normalize(&t.user_message),
            normalize(t.reply.as_deref().unwrap_or("")),
        )
    };
    (1..=n / 2).find_map(|k| {
        let repeats = (0..k).all(|i| key(&turns[n - k + i]) == key(&turns[n - 2 * k + i]));
        repeats.then_some((k, n - 2 * k))
    })
}

/// The detail of a cycle's fidelity check.
pub fn cycle_detail(period: usize, first: usize) -> String {
    let span = |a: usize, k: usize| {
        if k == 1 {
            format!("turn {a}")
        } else {
            format!("turns {a}–{}", a + k - 1)
        }
    };
    format!(
        "cycle: {} repeat {} (the same user and agent messages); stopped at the second cycle",
        span(first + period, period),
        span(first, period)
    )
}

/// The fidelity judge's request: who the user is (`brief`) and what the simulated user
/// wrote, nothing of the agent's.
pub fn request(brief: &str, messages: &[&str]) -> LlmRequest {
    let system = "You check a role-play. An AI was told to play a USER talking to a \
                  customer-service agent. Decide if it broke character. It broke character if \
                  it: contradicted the user's facts; invented facts the user could not know; \
                  spoke as the agent (offered help, confirmed actions only the agent performs); \
                  ended without cause; repeated itself in a loop. Reply with JSON only: \
                  {\"broke_character\": true or false, \"reason\": \"one short sentence\"}";
    let mut listed = String::new();
    for (i, m) in messages.iter().enumerate() {
        listed.push_str(&format!("{}. {}\n", i + 1, m.trim()));
    }
    let user = format!(
        "The user it had to play:\n{brief}\n\nWhat it wrote as the user, in order (the \
         agent's replies are left out):\n{listed}\nDid it break character? JSON only."
    );
    LlmRequest {
        messages: vec![LlmMessage::system(system), LlmMessage::user(user)],
        json_schema: Some(json!({
            "type": "object",
            "properties": {
                "broke_character": {"type": "boolean"},
                "reason": {"type": "string"}
            },
            "required": ["broke_character", "reason"],
            "additionalProperties": false
        })),
        ..LlmRequest::default()
    }
}

/// The judge's verdict: whether the simulator broke character, and why. A JSON object
/// anywhere in the text (`broke_character`, or `broken`/`valid`), else `key: value` lines,
/// else a leading yes/no; anything else is `Err` with the text shown.
pub fn parse(text: &str) -> Result<(bool, Option<String>), String> {
    fn truth(v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::String(s) => word(s),
            _ => None,
        }
    }
    fn word(s: &str) -> Option<bool> {
        let w = s
            .trim()
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_ascii_lowercase();
        match w.as_str() {
            "true" | "yes" => Some(true),
            "false" | "no" => Some(false),
            _ => None,
        }
    }
    let unusable = |why: &str| {
        format!(
            "the fidelity judge's answer is unusable ({why}): {}",
            quote(text)
        )
    };
    // Two answers are none, as for judges (`judge::parse_answer`): which one the judge meant
    // is not for the parser to guess.
    let object =
        super::judge::json_answer(text).map_err(|_| unusable("two different JSON answers"))?;
    let lines = super::judge::key_lines(text);
    let line = lines
        .get("broke_character")
        .or_else(|| lines.get("broke character"))
        .and_then(|v| word(v));
    if let Some(o) = object {
        let broke = o
            .get("broke_character")
            .or_else(|| o.get("broken"))
            .and_then(truth)
            .or_else(|| o.get("valid").and_then(truth).map(|v| !v));
        if let Some(broke) = broke {
            if line.is_some_and(|said| said != broke) {
                return Err(unusable(
                    "a JSON object and a `broke_character:` line that disagree",
                ));
            }
            let reason = o.get("reason").and_then(Value::as_str).map(str::to_owned);
            return Ok((broke, reason.filter(|r| !r.trim().is_empty())));
        }
    }
    if let Some(broke) = line {
        return Ok((broke, lines.get("reason").cloned()));
    }
    let first = text.split_whitespace().next().unwrap_or("");
    // "No, yes." says both: which one is not for the parser to guess.
    let both = {
        let said: Vec<bool> = text.split_whitespace().filter_map(word).collect();
        said.contains(&true) && said.contains(&false)
    };
    if let Some(broke) = word(first).filter(|_| !both) {
        let rest = text.trim()[first.len()..].trim();
        let rest = rest.trim_start_matches([',', '.', ':', '-', ' ']).trim();
        return Ok((broke, (!rest.is_empty()).then(|| rest.to_owned())));
    }
    Err(format!(
        "the fidelity judge's answer is unusable (no `broke_character`): {}",
        quote(text)
    ))
}

/// `text` quoted for a detail, cut at 160 characters.
fn quote(text: &str) -> String {
    let mut chars = text.trim().chars();
    let mut shown: String = chars.by_ref().take(160).collect();
    if chars.next().is_some() {
        shown.push('…');
    }
    crate::record::shown::quoted(&shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(user: &str, reply: &str) -> TurnRecord {
        TurnRecord {
            user_message: user.into(),
            reply: Some(reply.into()),
            ..TurnRecord::default()
        }
    }

    #[test]
    fn guards_catch_the_common_breaks_and_let_users_talk() {
        let replies = ["Which order is it?", "Thanks, refund started."];
        let g = |m: &str, prev: Option<&str>| guard(m, prev, replies.iter().copied());
        assert!(g("  ", None).is_some_and(|r| r.starts_with("empty message")));
        assert!(
            g(
                "The order number is ORD-12345.",
                Some("the order number is ORD-12345")
            )
            .is_some_and(|r| r.starts_with("repeat"))
        );
        assert!(
            g(
                "Thank you for confirming the delivery. I will proceed with the refund process.",
                None
            )
            .is_some_and(|r| r.starts_with("agent's voice"))
        );
        assert!(g("which order is it", None).is_some_and(|r| r.contains("copied")));
        assert_eq!(
            g("It's ORD-12345, thanks for confirming!", Some("Hi")),
            None
        );
        assert_eq!(g("Can you help me with a refund?", None), None);
    }

    #[test]
    fn a_cycle_is_found_at_its_second_round_and_not_before() {
        let a = turn("The order number is ORD-12345.", "Thanks.");
        let b = turn("Please refund it.", "Which order?");
        assert_eq!(cycle(&[a.clone(), b.clone(), a.clone()]), None);
        assert_eq!(
            cycle(&[a.clone(), b.clone(), a.clone(), b.clone()]),
            Some((2, 0))
        );
        let c = turn("Hi", "Hello");
        assert_eq!(
            cycle(&[c.clone(), a.clone(), b.clone(), a.clone(), b.clone()]),
            Some((2, 1))
        );
        assert_eq!(cycle(&[c.clone(), c.clone()]), Some((1, 0)));
        assert_eq!(cycle(&[] as &[TurnRecord]), None);
        assert_eq!(
            cycle_detail(2, 1),
            "cycle: turns 3–4 repeat turns 1–2 (the same user and agent messages); stopped at \
             the second cycle"
        );
    }

    #[test]
    fn small_model_answers_are_read_leniently_and_garbage_is_refused() {
        assert_eq!(
            parse(r#"{"broke_character": true, "reason": "spoke as the agent"}"#),
            Ok((true, Some("spoke as the agent".into())))
        );
        assert_eq!(
            parse("```json\n{\"broke_character\": \"no\", \"reason\": \"\"}\n```"),
            Ok((false, None))
        );
        assert_eq!(parse(r#"{"valid": true}"#), Ok((false, None)));
        assert_eq!(
            parse("broke_character: yes\nreason: invented an order"),
            Ok((true, Some("invented an order".into())))
        );
        assert_eq!(
            parse("No, it stayed in character."),
            Ok((false, Some("it stayed in character.".into())))
        );
        assert!(parse("I think the agent did fine").is_err());
        // Both ways at once is no answer.
        assert!(parse("No, yes.").is_err());
        assert!(parse("Yes. No wait, no.").is_err());
    }

    /// An object and a line that disagree are no answer, as for judges; agreeing, one.
    #[test]
    fn a_json_verdict_and_a_line_that_disagree_are_no_answer() {
        for two in [
            "{\"broke_character\": false, \"reason\": \"fine\"}\nbroke_character: yes",
            "Broke character: no\n{\"broke_character\": true}",
            r#"{"broke_character": false, "broke_character": true}"#,
            r#"{"broke_character": false} then {"broke_character": true}"#,
        ] {
            let e = parse(two).unwrap_err();
            assert!(e.contains("unusable"), "{two:?}: {e}");
        }
        assert_eq!(
            parse("{\"broke_character\": true, \"reason\": \"x\"}\nbroke_character: yes"),
            Ok((true, Some("x".into())))
        );
    }

    #[test]
    fn the_request_holds_only_the_users_side() {
        let r = request("Persona: angry customer", &["I want a refund", "Now!"]);
        let text: String = r.messages.iter().map(|m| m.content.as_str()).collect();
        assert!(text.contains("1. I want a refund\n2. Now!"));
        assert!(text.contains("angry customer"));
        assert!(r.json_schema.is_some());
    }
}
