//! `builtin="booking"`: a deterministic duct-cleaning booking agent speaking Connexity.
//!
//! It stands in for a real LLM agent in examples, tests and benchmarks, so it behaves like
//! one on the wire (its own tool loop: assistant tool calls, `tool` results, final reply,
//! model, provider, usage) while being fully deterministic and cheap: it keeps no state
//! between calls and rebuilds the conversation state by replaying the user messages of the
//! history it is sent, as the Connexity protocol resends the whole history every turn.
//!
//! Tools: `check_service_area {zone}` (Canadian postal codes starting with V, Metro
//! Vancouver, are serviced), `quote_price {zone, service}` ($249), `create_booking {zone,
//! day}` (the id is a hash of zone and day), `cancel_booking {booking_id}`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::LazyLock;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use regex::Regex;
use serde::{Deserialize, Serialize};

use trellis_engine::protocol::{ChatMessage, ToolCall, ToolCallFunction, Usage};

/// Where the agent answers.
pub const PATH: &str = "/agent/respond";
pub const MODEL: &str = "trellis-booking-1";
pub const PROVIDER: &str = "trellis";
/// The price of a duct cleaning, in dollars.
pub const PRICE: u32 = 249;

/// A Canadian postal code (`V4T 0A7`, `v4t0a7`, `V4T-0A7`) or a US ZIP code. ASCII only
/// (`-u`), as postal codes are: Unicode case folding and word boundaries made compiling it
/// touch about 110 fresh pages, in the first turn of every run against this agent.
static POSTAL_CODE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i-u)\b(?:([a-z][0-9][a-z])[ -]?([0-9][a-z][0-9])|([0-9]{5}))\b")
        .expect("the postal-code pattern is a valid regex")
});

const DAYS: [(&str, &str); 7] = [
    ("monday", "Monday"),
    ("tuesday", "Tuesday"),
    ("wednesday", "Wednesday"),
    ("thursday", "Thursday"),
    ("friday", "Friday"),
    ("saturday", "Saturday"),
    ("sunday", "Sunday"),
];

/// Attempts to make the agent leave its role; answered with a refusal.
const JAILBREAK: &[&str] = &[
    "ignore your instructions",
    "ignore all instructions",
    "ignore previous",
    "ignore all previous",
    "ignore the above",
    "ignore your previous",
    "disregard your instructions",
    "disregard previous",
    "system prompt",
    "developer mode",
    "jailbreak",
    "pretend you are",
    "pretend to be",
    "you are now",
];

const PRICE_WORDS: &[&str] = &["price", "prices", "cost", "costs", "quote", "much", "fee"];
const BOOK_WORDS: &[&str] = &[
    "book",
    "booking",
    "clean",
    "cleaning",
    "duct",
    "ducts",
    "appointment",
    "schedule",
    "visit",
];
const BYE_WORDS: &[&str] = &["bye", "goodbye", "thanks", "thank", "cheers"];
const HELLO_WORDS: &[&str] = &["hi", "hello", "hey", "morning", "afternoon", "evening"];

/// The agent's routes: `POST /agent/respond`.
pub fn router() -> Router {
    Router::new().route(PATH, post(respond))
}

async fn respond(body: Bytes) -> Response {
    match answer(&body) {
        Ok(json) => ([(CONTENT_TYPE, "application/json")], json).into_response(),
        Err(message) => {
            let body = serde_json::json!({ "error": message }).to_string();
            (
                StatusCode::BAD_REQUEST,
                [(CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
    }
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    messages: Vec<InMessage<'a>>,
}

#[derive(Deserialize)]
struct InMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct AgentResponse {
    messages: Vec<ChatMessage>,
    model: &'static str,
    provider: &'static str,
    usage: Usage,
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// Answers one request body with a response body, or says why the request is malformed.
pub fn answer(body: &[u8]) -> Result<Vec<u8>, String> {
    let request: Request<'_> =
        serde_json::from_slice(body).map_err(|e| format!("invalid AgentRequest: {e}"))?;

    let mut state = State::default();
    let mut lower = String::new();
    let mut prompt_words = 0u64;
    let users = request.messages.iter().filter(|m| m.role == "user").count();
    let last_is_user = request.messages.last().is_some_and(|m| m.role == "user");
    let mut turn = Turn::new(users);
    let mut seen = 0;
    for message in &request.messages {
        let text = message.content.as_deref().unwrap_or("");
        prompt_words += word_count(text);
        if message.role != "user" {
            continue;
        }
        seen += 1;
        let intent = Intent::of(text, &mut lower);
        let out = (last_is_user && seen == users).then_some(&mut turn);
        act(&mut state, intent, out);
    }
    if !last_is_user {
        // Nothing to answer yet (the agent speaks first): open the conversation.
        act(&mut state, Intent::Greeting, Some(&mut turn));
    }

    let (messages, completion_words) = turn.finish();
    let response = AgentResponse {
        messages,
        model: MODEL,
        provider: PROVIDER,
        usage: Usage {
            cost: Default::default(),
            prompt_tokens: Some(prompt_words),
            completion_tokens: Some(completion_words),
            total_tokens: Some(prompt_words + completion_words),
            priced_prompt_tokens: None,
        },
        metadata: serde_json::Map::new(),
    };
    serde_json::to_vec(&response).map_err(|e| format!("could not encode the response: {e}"))
}

/// What the conversation has established so far.
#[derive(Default)]
struct State {
    zone: Option<Zone>,
    booking: Option<Booking>,
}

struct Zone {
    /// Uppercase, no spaces: `V4T0A7`.
    code: String,
    canadian: bool,
}

impl Zone {
    fn serviced(&self) -> bool {
        self.canadian && self.code.starts_with('V')
    }

    /// As people write it: `V4T 0A7`.
    fn display(&self) -> Cow<'_, str> {
        match (self.canadian, self.code.get(..3), self.code.get(3..)) {
            (true, Some(a), Some(b)) => Cow::Owned(format!("{a} {b}")),
            _ => Cow::Borrowed(&self.code),
        }
    }
}

struct Booking {
    id: String,
    day: &'static str,
}

enum Intent {
    Refuse,
    Cancel,
    Area {
        zone: Zone,
        day: Option<&'static str>,
    },
    Day(&'static str),
    Price,
    Book,
    Goodbye,
    Greeting,
}

impl Intent {
    /// Reads what a user message asks for; `lower` is a reusable buffer.
    fn of(text: &str, lower: &mut String) -> Intent {
        lower.clear();
        lower.extend(text.chars().map(|c| c.to_ascii_lowercase()));
        let lower = lower.as_str();
        if JAILBREAK.iter().any(|p| lower.contains(p)) {
            return Intent::Refuse;
        }
        let has = |set: &[&str]| words(lower).any(|w| set.contains(&w));
        if has(&["cancel", "cancellation"]) {
            return Intent::Cancel;
        }
        let day = words(lower).find_map(|w| DAYS.iter().find(|(d, _)| *d == w).map(|(_, d)| *d));
        if let Some(caps) = POSTAL_CODE.captures(text) {
            let zone = match (caps.get(1), caps.get(2), caps.get(3)) {
                (Some(a), Some(b), _) => Zone {
                    code: format!("{}{}", a.as_str(), b.as_str()).to_ascii_uppercase(),
                    canadian: true,
                },
                (_, _, Some(zip)) => Zone {
                    code: zip.as_str().to_owned(),
                    canadian: false,
                },
                _ => return Intent::Refuse,
            };
            return Intent::Area { zone, day };
        }
        if let Some(day) = day {
            return Intent::Day(day);
        }
        if has(PRICE_WORDS) || lower.contains('$') {
            return Intent::Price;
        }
        if has(&["bye", "goodbye"]) {
            return Intent::Goodbye;
        }
        if has(BOOK_WORDS) {
            return Intent::Book;
        }
        if has(BYE_WORDS) {
            return Intent::Goodbye;
        }
        if has(HELLO_WORDS) {
            return Intent::Greeting;
        }
        Intent::Refuse
    }
}

fn words(lower: &str) -> impl Iterator<Item = &str> {
    lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
}

fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// Applies what the user asked to the state and, for the turn being answered, writes the
/// tool calls and the reply.
fn act(state: &mut State, intent: Intent, out: Option<&mut Turn>) {
    match intent {
        Intent::Refuse => {
            if let Some(turn) = out {
                turn.reply.push_str(
                    "I'm sorry, I can't help with that. I can only help with duct cleaning \
                     bookings and service-area questions.",
                );
            }
        }
        Intent::Cancel => match (state.booking.take(), out) {
            (Some(booking), Some(turn)) => {
                turn.tool(
                    "cancel_booking",
                    format!(r#"{{"booking_id":"{}"}}"#, booking.id),
                    format!(r#"{{"booking_id":"{}","status":"cancelled"}}"#, booking.id),
                );
                let _ = write!(
                    turn.reply,
                    "Your booking {} for {} has been cancelled.",
                    booking.id, booking.day
                );
            }
            (None, Some(turn)) => turn
                .reply
                .push_str("You don't have a booking with us, so there is nothing to cancel."),
            (_, None) => {}
        },
        Intent::Area { zone, day } => {
            let serviced = zone.serviced();
            let mut out = out;
            if let Some(turn) = out.as_deref_mut() {
                turn.tool(
                    "check_service_area",
                    format!(r#"{{"zone":"{}"}}"#, zone.code),
                    if serviced {
                        format!(
                            r#"{{"zone":"{}","serviced":true,"region":"Metro Vancouver"}}"#,
                            zone.code
                        )
                    } else {
                        format!(r#"{{"zone":"{}","serviced":false}}"#, zone.code)
                    },
                );
                if serviced {
                    turn.quote(&zone.code);
                    let _ = write!(
                        turn.reply,
                        "Good news — we service {} in Metro Vancouver. A duct cleaning is ${PRICE}. ",
                        zone.display()
                    );
                } else {
                    let _ = write!(
                        turn.reply,
                        "Sorry, we don't service {} — we only cover Metro Vancouver.",
                        zone.display()
                    );
                }
            }
            let zone = state.zone.insert(zone);
            if serviced {
                match day {
                    Some(day) => book(zone, &mut state.booking, day, out),
                    None => {
                        if let Some(turn) = out {
                            turn.reply.push_str("Which day works best for you?");
                        }
                    }
                }
            }
        }
        Intent::Day(day) => match &state.zone {
            Some(zone) if zone.serviced() => book(zone, &mut state.booking, day, out),
            Some(zone) => {
                if let Some(turn) = out {
                    let _ = write!(
                        turn.reply,
                        "Sorry, I can't book a visit in {}: it is outside our Metro Vancouver \
                         service area.",
                        zone.display()
                    );
                }
            }
            None => {
                if let Some(turn) = out {
                    let _ = write!(
                        turn.reply,
                        "I'd be happy to book {day} — first, what is your postal code?"
                    );
                }
            }
        },
        Intent::Price => {
            let Some(turn) = out else { return };
            match &state.zone {
                Some(zone) if zone.serviced() => {
                    turn.quote(&zone.code);
                    let _ = write!(
                        turn.reply,
                        "A duct cleaning in {} is ${PRICE}, taxes included.",
                        zone.display()
                    );
                }
                Some(zone) => {
                    let _ = write!(
                        turn.reply,
                        "We don't service {}, so I can't quote a price there.",
                        zone.display()
                    );
                }
                None => {
                    let _ = write!(
                        turn.reply,
                        "A standard duct cleaning is ${PRICE}. What is your postal code, so I can \
                         check that we service your area?"
                    );
                }
            }
        }
        Intent::Book => {
            let Some(turn) = out else { return };
            match (&state.zone, &state.booking) {
                (None, _) => turn
                    .reply
                    .push_str("I can help with that. What is your postal code?"),
                (Some(_), Some(booking)) => {
                    let _ = write!(
                        turn.reply,
                        "You're already booked for {}, confirmation {}. Anything else?",
                        booking.day, booking.id
                    );
                }
                (Some(zone), None) if zone.serviced() => {
                    turn.reply.push_str("Sure. Which day works best for you?")
                }
                (Some(zone), None) => {
                    let _ = write!(
                        turn.reply,
                        "Sorry, we don't service {} — we only cover Metro Vancouver.",
                        zone.display()
                    );
                }
            }
        }
        Intent::Goodbye => {
            let Some(turn) = out else { return };
            match &state.booking {
                Some(booking) => {
                    let _ = write!(
                        turn.reply,
                        "Thanks for booking with us — see you on {}. Goodbye!",
                        booking.day
                    );
                }
                None => turn.reply.push_str("Thanks for contacting us. Goodbye!"),
            }
        }
        Intent::Greeting => {
            let Some(turn) = out else { return };
            if state.zone.is_some() {
                turn.reply
                    .push_str("Hi! How else can I help with your duct cleaning?");
            } else {
                turn.reply
                    .push_str("Hi! I can help you book a duct cleaning. What is your postal code?");
            }
        }
    }
}

/// Books `day` in `zone` (a serviced zone), unless that exact booking already exists.
fn book(zone: &Zone, booking: &mut Option<Booking>, day: &'static str, out: Option<&mut Turn>) {
    if let Some(existing) = booking.as_ref().filter(|b| b.day == day) {
        if let Some(turn) = out {
            let _ = write!(
                turn.reply,
                "You're already booked for {day}, confirmation {}.",
                existing.id
            );
        }
        return;
    }
    let id = booking_id(&zone.code, day);
    if let Some(turn) = out {
        turn.tool(
            "create_booking",
            format!(r#"{{"zone":"{}","day":"{day}"}}"#, zone.code),
            format!(
                r#"{{"booking_id":"{id}","zone":"{}","day":"{day}","status":"confirmed"}}"#,
                zone.code
            ),
        );
        let _ = write!(
            turn.reply,
            "You're booked for a duct cleaning on {day}, confirmation {id}."
        );
    }
    *booking = Some(Booking { id, day });
}

/// `BK-` and 8 hex digits of an FNV-1a hash: stable across runs, platforms and Rust versions.
fn booking_id(zone: &str, day: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in zone.bytes().chain([b'|']).chain(day.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("BK-{:08X}", (hash >> 32) ^ (hash & 0xffff_ffff))
}

/// The messages of the turn being answered.
struct Turn {
    /// 1-based number of the user message answered, for call ids unique in the conversation.
    number: usize,
    calls: Vec<ToolCall>,
    results: Vec<ChatMessage>,
    reply: String,
}

impl Turn {
    fn new(number: usize) -> Self {
        Turn {
            number,
            calls: Vec::new(),
            results: Vec::new(),
            reply: String::new(),
        }
    }

    fn tool(&mut self, name: &'static str, arguments: String, result: String) {
        let id = format!("call_{}_{}", self.number, self.calls.len() + 1);
        self.results.push(ChatMessage {
            role: "tool".to_owned(),
            content: Some(result),
            tool_call_id: Some(id.clone()),
            name: Some(name.to_owned()),
            ..ChatMessage::default()
        });
        self.calls.push(ToolCall {
            id,
            kind: "function".to_owned(),
            function: ToolCallFunction {
                name: name.to_owned(),
                arguments,
            },
        });
    }

    fn quote(&mut self, zone: &str) {
        self.tool(
            "quote_price",
            format!(r#"{{"zone":"{zone}","service":"duct_cleaning"}}"#),
            format!(
                r#"{{"zone":"{zone}","service":"duct_cleaning","price":{PRICE},"currency":"CAD"}}"#
            ),
        );
    }

    /// The turn's messages and its completion word count.
    fn finish(self) -> (Vec<ChatMessage>, u64) {
        let mut words = word_count(&self.reply);
        let mut messages = Vec::with_capacity(self.results.len() + 2);
        if !self.calls.is_empty() {
            words += self.calls.len() as u64;
            messages.push(ChatMessage {
                role: "assistant".to_owned(),
                content: None,
                tool_calls: self.calls,
                ..ChatMessage::default()
            });
            messages.extend(self.results);
        }
        messages.push(ChatMessage::assistant(self.reply.trim_end()));
        (messages, words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booking_ids_are_stable() {
        assert_eq!(
            booking_id("V4T0A7", "Tuesday"),
            booking_id("V4T0A7", "Tuesday")
        );
        assert_ne!(
            booking_id("V4T0A7", "Tuesday"),
            booking_id("V4T0A7", "Monday")
        );
        assert!(booking_id("V4T0A7", "Tuesday").starts_with("BK-"));
        assert_eq!(booking_id("V4T0A7", "Tuesday").len(), 11);
    }

    #[test]
    fn postal_codes_are_normalised() {
        let mut buf = String::new();
        for text in ["It's V4T 0A7.", "v4t0a7", "my code is V4T-0A7 thanks"] {
            match Intent::of(text, &mut buf) {
                Intent::Area { zone, day: None } => assert_eq!(zone.code, "V4T0A7"),
                _ => panic!("no postal code found in {text:?}"),
            }
        }
    }

    #[test]
    fn malformed_requests_are_rejected() {
        assert!(answer(b"not json").is_err());
        assert!(answer(br#"{"messages": "hi"}"#).is_err());
        assert!(answer(br#"{"messages": [{"content": "hi"}]}"#).is_err());
        assert!(answer(br#"{"messages": [{"role": "user", "content": 3}]}"#).is_err());
    }
}
