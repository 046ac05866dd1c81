//! `builtin="weather"`: a deterministic weather agent speaking the AgentScope runtime protocol.
//!
//! It stands in for an agentscope-runtime ReAct agent in examples and tests, and behaves like
//! one on the wire: `POST /process` answers with server-sent events (one `data: <json>` line
//! per event, a blank line between events, no `event:`/`id:` lines), in the order a real
//! server sends them: response `created` → response `in_progress` → messages with their
//! content → response `completed` carrying `output[]`, `usage` and `session_id`. Both event
//! shapes real servers use appear: tool-call messages and the answer after a tool call come
//! with message `in_progress` and content `completed` events, plain text answers come as bare
//! deltas known only by their `msg_id`. `stream: false` answers with the final response as
//! one JSON body.
//!
//! The conversation lives on the server, keyed by `session_id` (a request without one joins
//! a shared session), so replaying a prefix in a fresh session is observable: "what did I
//! ask?" lists the cities asked about earlier in the same session. Two requests in flight on
//! one session collide (`Task … is already in RUNNING state.`), as on a real server.
//!
//! What it answers:
//! - a message about the weather naming a city (`weather in Paris?`): a `get_weather` tool
//!   call (`plugin_call` / `plugin_call_output` messages, the arguments `{"city": "Paris"}`,
//!   the output a JSON string of a text block list), then a text answer with the temperature;
//! - a weather question without a city: asks which city;
//! - `what did I ask` / `which cities` / `remember`: the cities of this session so far;
//! - a message mentioning `tornado`: a failing run (the tool "crashes"): the answer starts
//!   streaming, then the response ends `failed` with
//!   `error {code: "AGENT_UNKNOWN_ERROR", message}` and the message never completes;
//! - anything else: a greeting.
//!
//! Input errors are answered the way agentscope-runtime answers them: a body that is not
//! JSON gets HTTP 422; a request that fails validation (no `input`, `content` not a list)
//! gets HTTP 200 with the single frame `data: {"error": "…"}`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use regex::Regex;
use serde_json::{Value, json};

/// Where the agent answers.
pub const PATH: &str = "/process";
/// The tool the agent calls for weather questions.
pub const TOOL: &str = "get_weather";
/// Messages mentioning this word make the run fail.
pub const FAIL_TRIGGER: &str = "tornado";
/// The error code of a failing run.
pub const FAIL_CODE: &str = "AGENT_UNKNOWN_ERROR";

/// Pause between two streamed events, so that time to first event and latency differ the
/// way they do with a real model.
const EVENT_GAP: Duration = Duration::from_millis(1);
/// Sessions kept; the oldest idle ones are forgotten past this (a long run opens many).
const MAX_SESSIONS: usize = 10_000;

/// A city after `in`, `for` or `at`: "weather in New York today?" → `New York`.
static CITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:in|for|at)\s+([a-z][a-z'\-]*(?:\s+[a-z][a-z'\-]*){0,2}?)\s*(?:[?.!,;]|\s+(?:today|tomorrow|now|right|this|please)\b|$)")
        .expect("the city pattern is a valid regex")
});

/// Known cities: (name, °C, sky). Others get a temperature derived from their name.
const CITIES: &[(&str, i32, &str)] = &[
    ("paris", 18, "sunny"),
    ("london", 12, "rainy"),
    ("tokyo", 22, "clear"),
    ("new york", 15, "cloudy"),
    ("sydney", 25, "sunny"),
    ("berlin", 9, "overcast"),
];

const SKIES: [&str; 4] = ["sunny", "cloudy", "rainy", "windy"];

#[derive(Default)]
struct Sessions {
    by_id: HashMap<String, Conversation>,
    /// Bumps on every request, to order sessions by last use.
    clock: u64,
}

#[derive(Default)]
struct Conversation {
    /// Cities asked about, in order.
    cities: Vec<String>,
    /// User messages received.
    messages: u32,
    running: bool,
    last_used: u64,
}

type Shared = Arc<Mutex<Sessions>>;

pub fn router() -> Router {
    Router::new()
        .route(PATH, post(process))
        .with_state(Shared::default())
}

/// Clears a session's running flag when its answer is over, however it ends (a client that
/// hangs up mid-stream drops the stream, and this with it).
struct RunningGuard {
    sessions: Shared,
    session_id: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(conversation) = sessions.by_id.get_mut(&self.session_id) {
            conversation.running = false;
        }
    }
}

async fn process(State(sessions): State<Shared>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let detail = json!({"detail": [{"type": "json_invalid", "msg": e.to_string()}]});
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                [(CONTENT_TYPE, "application/json")],
                detail.to_string(),
            )
                .into_response();
        }
    };
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let text = match user_text(&request) {
        Ok(text) => text,
        Err(error) => return error_frame(&error),
    };
    let session_id = request
        .get("session_id")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();

    let (answer, number) = {
        let mut all = sessions.lock().unwrap_or_else(PoisonError::into_inner);
        all.clock += 1;
        let now = all.clock;
        if !all.by_id.contains_key(&session_id) && all.by_id.len() >= MAX_SESSIONS {
            forget_oldest_idle(&mut all);
        }
        let conversation = all.by_id.entry(session_id.clone()).or_default();
        if conversation.running {
            return error_frame(&format!("Task {session_id} is already in RUNNING state."));
        }
        conversation.running = true;
        conversation.last_used = now;
        conversation.messages += 1;
        (decide(&text, conversation), conversation.messages)
    };
    let guard = RunningGuard {
        sessions: sessions.clone(),
        session_id: session_id.clone(),
    };
    let events = script(&session_id, number, &answer);
    if !stream {
        drop(guard);
        let last = events.last().cloned().unwrap_or(Value::Null);
        return ([(CONTENT_TYPE, "application/json")], last.to_string()).into_response();
    }
    let frames = futures::stream::unfold(
        (events.into_iter(), guard, true),
        |(mut events, guard, first)| async move {
            let event = events.next()?;
            if !first {
                tokio::time::sleep(EVENT_GAP).await;
            }
            let frame = Bytes::from(format!("data: {event}\n\n"));
            Some((Ok::<_, Infallible>(frame), (events, guard, false)))
        },
    );
    sse_response(Body::from_stream(frames))
}

fn forget_oldest_idle(sessions: &mut Sessions) {
    let oldest = sessions
        .by_id
        .iter()
        .filter(|(_, c)| !c.running)
        .min_by_key(|(_, c)| c.last_used)
        .map(|(id, _)| id.clone());
    if let Some(id) = oldest {
        sessions.by_id.remove(&id);
    }
}

fn sse_response(body: Body) -> Response {
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// A request that fails validation: HTTP 200 with one error frame, as the real server does.
fn error_frame(message: &str) -> Response {
    sse_response(Body::from(format!(
        "data: {}\n\n",
        json!({"error": message})
    )))
}

/// The text of the last user message, or why the request is invalid.
fn user_text(request: &Value) -> Result<String, String> {
    let Some(input) = request.get("input").and_then(Value::as_array) else {
        return Err("input: field required (a list of messages)".to_owned());
    };
    let Some(last) = input.last() else {
        return Err("input: at least one message is required".to_owned());
    };
    let content = match last.get("content") {
        Some(Value::Array(content)) => content,
        Some(_) => return Err("input.content: Input should be a valid list".to_owned()),
        None => return Err("input.content: field required".to_owned()),
    };
    Ok(content
        .iter()
        .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|c| c.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// What the agent does with one message.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// Call `get_weather` for the city, then say what it returned.
    Weather {
        city: String,
        celsius: i32,
        sky: String,
    },
    /// Text only.
    Say(String),
    /// Start answering, then fail the run.
    Fail { partial: String, message: String },
}

fn decide(text: &str, conversation: &mut Conversation) -> Answer {
    let lower = text.to_lowercase();
    if lower.contains(FAIL_TRIGGER) {
        return Answer::Fail {
            partial: "Checking the severe-weather feed".to_owned(),
            message: format!("{TOOL} failed: the severe-weather feed is unavailable"),
        };
    }
    if ["what did i ask", "which cities", "remember"]
        .iter()
        .any(|p| lower.contains(p))
    {
        return Answer::Say(if conversation.cities.is_empty() {
            "You have not asked me about any city yet.".to_owned()
        } else {
            format!(
                "So far you asked me about {}.",
                conversation.cities.join(", ")
            )
        });
    }
    let about_weather = [
        "weather",
        "temperature",
        "forecast",
        "rain",
        "sunny",
        "hot",
        "cold",
    ]
    .iter()
    .any(|w| lower.contains(w));
    if about_weather {
        let Some(city) = CITY
            .captures(text)
            .and_then(|c| c.get(1))
            .map(|m| title_case(m.as_str()))
        else {
            return Answer::Say("Which city would you like the weather for?".to_owned());
        };
        let (celsius, sky) = forecast(&city);
        conversation.cities.push(city.clone());
        return Answer::Weather {
            city,
            celsius,
            sky: sky.to_owned(),
        };
    }
    Answer::Say("Hello! I am the weather agent. Ask me about the weather in any city.".to_owned())
}

fn title_case(city: &str) -> String {
    city.split_whitespace()
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            }
        })
        .collect::<Vec<String>>()
        .join(" ")
}

fn forecast(city: &str) -> (i32, &'static str) {
    let lower = city.to_lowercase();
    if let Some((_, celsius, sky)) = CITIES.iter().find(|(name, _, _)| *name == lower) {
        return (*celsius, sky);
    }
    let sum: u32 = lower.bytes().map(u32::from).sum();
    let celsius = i32::try_from(sum % 30).unwrap_or(0);
    let sky = SKIES
        .get(usize::try_from(sum).unwrap_or(0) % SKIES.len())
        .copied()
        .unwrap_or("cloudy");
    (celsius, sky)
}

/// Builds the events of one answer, in order; the last one is the final response.
struct Script {
    events: Vec<Value>,
    sequence: u64,
    response_id: String,
    session_id: String,
    /// Completed messages, for the final response's `output`.
    output: Vec<Value>,
}

impl Script {
    fn push(&mut self, mut event: Value) {
        if let Some(map) = event.as_object_mut() {
            map.insert("sequence_number".to_owned(), json!(self.sequence));
        }
        self.sequence += 1;
        self.events.push(event);
    }

    fn response(&mut self, status: &str, extra: Value) {
        let mut event = json!({
            "id": self.response_id,
            "object": "response",
            "status": status,
            "created_at": 0,
            "session_id": self.session_id,
        });
        if let (Some(map), Value::Object(extra)) = (event.as_object_mut(), extra) {
            map.extend(extra);
        }
        self.push(event);
    }

    /// A message whose data content arrives as snapshots (the full shape): created,
    /// in_progress, the data first with empty arguments then whole, completed.
    fn data_message(&mut self, id: &str, kind: &str, role: &str, first: Value, full: Value) {
        let header = |status: &str| {
            json!({"id": id, "object": "message", "type": kind, "role": role,
                   "status": status, "content": []})
        };
        self.push(header("created"));
        self.push(header("in_progress"));
        let content = |status: &str, data: &Value| {
            json!({"object": "content", "type": "data", "index": 0, "delta": false,
                   "msg_id": id, "status": status, "data": data})
        };
        self.push(content("in_progress", &first));
        self.push(content("in_progress", &full));
        self.push(content("completed", &full));
        let done = json!({"id": id, "object": "message", "type": kind, "role": role,
            "status": "completed",
            "content": [{"object": "content", "type": "data", "index": 0, "delta": false,
                         "msg_id": id, "status": "completed", "data": full}]});
        self.output.push(done.clone());
        self.push(done);
    }

    /// An assistant text message streamed as deltas. `full_shape` adds message
    /// `in_progress` and content `completed` (with `"delta": null`), which text-only agents
    /// leave out. `complete` false stops after the deltas (a run that fails mid-answer).
    fn text_message(&mut self, id: &str, text: &str, full_shape: bool, complete: bool) {
        if full_shape {
            self.push(json!({"id": id, "object": "message", "type": "message",
                "role": "assistant", "status": "created", "content": []}));
            self.push(json!({"id": id, "object": "message", "type": "message",
                "role": "assistant", "status": "in_progress", "content": []}));
        }
        for piece in text.split_inclusive(' ') {
            self.push(
                json!({"object": "content", "type": "text", "index": 0, "delta": true,
                "msg_id": id, "status": "in_progress", "text": piece}),
            );
        }
        if !complete {
            return;
        }
        let content = json!({"object": "content", "type": "text", "index": 0, "delta": null,
            "msg_id": id, "status": "completed", "text": text});
        if full_shape {
            self.push(content.clone());
        }
        let done = json!({"id": id, "object": "message", "type": "message",
            "role": "assistant", "status": "completed", "content": [content]});
        self.output.push(done.clone());
        self.push(done);
    }
}

/// The events answering message `number` of `session_id`.
fn script(session_id: &str, number: u32, answer: &Answer) -> Vec<Value> {
    let prefix = format!("{session_id}_{number}");
    let mut s = Script {
        events: Vec::new(),
        sequence: 0,
        response_id: format!("response_{prefix}"),
        session_id: session_id.to_owned(),
        output: Vec::new(),
    };
    s.response("created", json!({}));
    s.response("in_progress", json!({}));
    let reply = match answer {
        Answer::Weather { city, celsius, sky } => {
            let call_id = format!("call_{prefix}");
            let arguments = json!({"city": city}).to_string();
            s.data_message(
                &format!("msg_{prefix}_call"),
                "plugin_call",
                "assistant",
                json!({"call_id": call_id, "name": TOOL, "arguments": ""}),
                json!({"call_id": call_id, "name": TOOL, "arguments": arguments}),
            );
            let result = format!("{city}: {celsius}°C, {sky}");
            let output = json!([{"type": "text", "text": result}]).to_string();
            s.data_message(
                &format!("msg_{prefix}_result"),
                "plugin_call_output",
                "tool",
                json!({"call_id": call_id, "name": TOOL, "output": ""}),
                json!({"call_id": call_id, "name": TOOL, "output": output}),
            );
            let reply = format!("It is {celsius}°C and {sky} in {city}.");
            s.text_message(&format!("msg_{prefix}_reply"), &reply, true, true);
            reply
        }
        Answer::Say(reply) => {
            s.text_message(&format!("msg_{prefix}_reply"), reply, false, true);
            reply.clone()
        }
        Answer::Fail { partial, message } => {
            s.text_message(&format!("msg_{prefix}_reply"), partial, true, false);
            s.response(
                "failed",
                json!({"error": {"code": FAIL_CODE, "message": message}, "output": []}),
            );
            return s.events;
        }
    };
    let output_tokens = u64::try_from(reply.split_whitespace().count()).unwrap_or(0);
    let output = std::mem::take(&mut s.output);
    s.response(
        "completed",
        json!({
            "completed_at": 0,
            "output": output,
            "usage": {"input_tokens": 12, "output_tokens": output_tokens,
                      "total_tokens": 12 + output_tokens},
        }),
    );
    s.events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Answer {
        decide(text, &mut Conversation::default())
    }

    #[test]
    fn finds_the_city() {
        assert_eq!(
            answer("What's the weather in new york today?"),
            Answer::Weather {
                city: "New York".into(),
                celsius: 15,
                sky: "cloudy".into()
            }
        );
        assert!(
            matches!(answer("weather in Paris"), Answer::Weather { city, .. } if city == "Paris")
        );
        assert!(
            matches!(answer("Is it hot in Lima?"), Answer::Weather { city, .. } if city == "Lima")
        );
        assert!(matches!(answer("what's the weather?"), Answer::Say(_)));
    }

    #[test]
    fn remembers_the_session() {
        let mut c = Conversation::default();
        decide("weather in Paris?", &mut c);
        decide("and the forecast for Tokyo?", &mut c);
        assert_eq!(
            decide("What did I ask?", &mut c),
            Answer::Say("So far you asked me about Paris, Tokyo.".into())
        );
    }

    #[test]
    fn a_failing_run_ends_failed_without_completing_its_message() {
        let events = script("s", 1, &answer("any tornado near Kansas?"));
        let last = events.last().cloned().unwrap_or_default();
        assert_eq!(last["status"], "failed");
        assert_eq!(last["error"]["code"], FAIL_CODE);
        assert!(
            !events
                .iter()
                .any(|e| e["object"] == "message" && e["status"] == "completed")
        );
    }

    #[test]
    fn the_final_response_carries_output_usage_and_session() {
        let events = script("s-1", 3, &answer("weather in Paris?"));
        let last = events.last().cloned().unwrap_or_default();
        assert_eq!(last["status"], "completed");
        assert_eq!(last["session_id"], "s-1");
        let kinds: Vec<_> = last["output"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["type"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(kinds, ["plugin_call", "plugin_call_output", "message"]);
        let sequence: Vec<_> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64())
            .collect();
        assert!(sequence.windows(2).all(|w| w[0] < w[1]));
    }
}
