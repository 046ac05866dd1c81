//! `builtin="numbers"`: a deterministic Fixie agent, for the example suite, `trellis import
//! fixie` and tests.
//!
//! It answers the way the Fixie SDK's own router does, errors included: `GET /` is the
//! handshake (base prompt and few-shots), `POST /FUNC` calls a function with
//! `{"message":{"text":…}}` and answers `{"message":{"text":…,"embeds":{}}}`; an unknown
//! function is a 404 `{"detail":"Func[NAME] doesn't exist"}`, a body without `message` a
//! pydantic-style 422, a function that raises a plain-text 500, and `GET /FUNC` a 405.
//!
//! Functions: `genrand "LOW, HIGH"` (a number in the range, chosen by a hash of the input so
//! the same input always gives the same number), `add "A, B, …"` (the sum of integers),
//! `echo` (answers its input unchanged) and `fail` (always raises).

use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// The agent answers at the server's root: the URL is the base URL.
pub const PATH: &str = "";

pub const BASE_PROMPT: &str = "I am a numbers agent. I pick random numbers in a range with \
     Func[genrand] and add integers with Func[add].";

/// The agent's few-shots. Every `Func[…] says` result is what the function really answers,
/// so a suite imported from them passes.
pub const FEW_SHOTS: &[&str] = &[
    "Q: Generate a random number between 0 and 19.\n\
     Ask Func[genrand]: 0, 19\n\
     Func[genrand] says: 17\n\
     A: The random number is 17.",
    "Q: What is 2 plus 3, plus 10?\n\
     Ask Func[add]: 2, 3\n\
     Func[add] says: 5\n\
     Ask Func[add]: 5, 10\n\
     Func[add] says: 15\n\
     A: 2 plus 3 is 5, and 5 plus 10 is 15.",
    "Q: Roll a die and tell me the weather in Paris.\n\
     Ask Func[genrand]: 1, 6\n\
     Func[genrand] says: 5\n\
     Ask Agent[weather]: What is the weather in Paris?\n\
     Agent[weather] says: Sunny, 21 degrees.\n\
     A: You rolled a 5. Paris is sunny at 21 degrees.",
];

pub fn router() -> Router {
    Router::new().route("/", get(handshake)).route(
        "/{function}",
        post(call).fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                axum::Json(json!({ "detail": "Method Not Allowed" })),
            )
        }),
    )
}

async fn handshake() -> Response {
    axum::Json(json!({
        "base_prompt": BASE_PROMPT,
        "few_shots": FEW_SHOTS,
        "conversational": false,
    }))
    .into_response()
}

async fn call(Path(function): Path<String>, body: Bytes) -> Response {
    let Some(text) = message_text(&body) else {
        return unprocessable(&body);
    };
    let result = match function.as_str() {
        "genrand" => genrand(&text),
        "add" => add(&text),
        "echo" => Ok(text),
        "fail" => Err(()),
        _ => {
            return (
                StatusCode::NOT_FOUND,
                axum::Json(json!({ "detail": format!("Func[{function}] doesn't exist") })),
            )
                .into_response();
        }
    };
    match result {
        Ok(answer) => axum::Json(json!({
            "message": { "text": answer, "embeds": {} }
        }))
        .into_response(),
        // What an uncaught exception in a FastAPI handler turns into.
        Err(()) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Internal Server Error",
        )
            .into_response(),
    }
}

/// `message.text` of a request body; `None` when the body is not what the SDK accepts.
fn message_text(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match value.get("message")?.get("text")? {
        Value::String(text) => Some(text.clone()),
        _ => None,
    }
}

/// A pydantic-v1 validation error naming the first missing or malformed field.
fn unprocessable(body: &[u8]) -> Response {
    let value: Option<Value> = serde_json::from_slice(body).ok();
    let detail = match value.as_ref() {
        None => json!({
            "loc": ["body"],
            "msg": "value is not a valid dict",
            "type": "type_error.dict",
        }),
        Some(v) if v.get("message").is_none() => json!({
            "loc": ["body", "message"],
            "msg": "field required",
            "type": "value_error.missing",
        }),
        Some(_) => json!({
            "loc": ["body", "message", "text"],
            "msg": "str type expected",
            "type": "type_error.str",
        }),
    };
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(json!({ "detail": [detail] })),
    )
        .into_response()
}

/// Integers separated by commas or whitespace.
fn integers(text: &str) -> Result<Vec<i64>, ()> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse::<i64>().map_err(|_| ()))
        .collect()
}

fn genrand(text: &str) -> Result<String, ()> {
    let [low, high] = integers(text)?[..] else {
        return Err(());
    };
    if low > high {
        return Err(());
    }
    let span = u64::try_from(i128::from(high) - i128::from(low) + 1).map_err(|_| ())?;
    let offset = i128::from(fnv1a(text.trim().as_bytes()) % span);
    i64::try_from(i128::from(low) + offset)
        .map(|n| n.to_string())
        .map_err(|_| ())
}

fn add(text: &str) -> Result<String, ()> {
    let numbers = integers(text)?;
    if numbers.is_empty() {
        return Err(());
    }
    numbers
        .into_iter()
        .try_fold(0i64, i64::checked_add)
        .map(|sum| sum.to_string())
        .ok_or(())
}

/// FNV-1a, 64 bits: a stable hash (std's hashers may change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_answer_what_the_few_shots_say() {
        assert_eq!(genrand("0, 19"), Ok("17".to_owned()));
        assert_eq!(genrand("1, 6"), Ok("5".to_owned()));
        assert_eq!(add("2, 3"), Ok("5".to_owned()));
        assert_eq!(add("5, 10"), Ok("15".to_owned()));
        assert_eq!(add("9223372036854775807, 1"), Err(()));
        assert_eq!(genrand("5, 1"), Err(()));
    }
}
