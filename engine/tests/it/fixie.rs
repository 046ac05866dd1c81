//! The Fixie protocol over real sockets: the builtin `numbers` agent end to end, and small
//! servers that answer the way real Fixie agents (and broken ones) do.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};
use trellis_agents as builtin;
use trellis_engine::protocol::fixie::FixieClient;
use trellis_engine::protocol::{AgentProtocol, Conversation, Session, Turn, TurnInput};
use trellis_engine::record::FaultCategory;
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};

use crate::support::ctx;

/// Serves `router` on an ephemeral loopback port; the server stops when the test ends.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

/// One request a test server saw.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// A server that records every request and answers with `answer(path)`.
async fn recording(
    answer: impl Fn(&str, &str) -> Response + Clone + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let handler = move |method: axum::http::Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let log = log.clone();
        let answer = answer.clone();
        async move {
            log.lock().unwrap().push(Seen {
                method: method.to_string(),
                path: uri.path().to_owned(),
                headers,
                body: body.to_vec(),
            });
            answer(method.as_str(), uri.path())
        }
    };
    let router = Router::new()
        .route("/", any(handler.clone()))
        .route("/{*rest}", any(handler));
    (serve(router).await, seen)
}

fn client(url: &str) -> FixieClient {
    client_with_headers(url, Vec::new())
}

fn client_with_headers(url: &str, headers: Vec<(String, String)>) -> FixieClient {
    FixieClient::new(
        url,
        headers,
        CallLimits {
            timeout: Duration::from_secs(5),
            max_response_size: 1024 * 1024,
        },
        RetryPolicy::default(),
        HttpTransport::new(),
    )
    .unwrap()
}

fn open(client: &FixieClient) -> Box<dyn Session> {
    client.open(&Conversation {
        run_id: "run",
        suite: "fixie",
        scenario: "case-1",
        repetition: 0,
        node: "start",
        sandbox: None,
        llm: None,
    })
}

async fn call(session: &mut Box<dyn Session>, function: &str, input: &str) -> Turn {
    let ctx = ctx(0);
    session
        .turn(TurnInput::Call { function, input }, &ctx)
        .await
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

const HANDSHAKE_JSON: &str = r#"{"base_prompt":"I add.","few_shots":["Q: 1+1?\nAsk Func[add]: 1, 1\nFunc[add] says: 2\nA: 2"]}"#;

#[tokio::test]
async fn builtin_numbers_end_to_end() {
    let server = builtin::serve("numbers").await.unwrap();
    let client = client(&server.url());

    let info = client.prepare().await.unwrap().unwrap();
    assert_eq!(info["format"], "json");
    assert_eq!(info["handshake"], "GET /");
    let few_shots = info["few_shots"].as_array().unwrap();
    assert_eq!(few_shots.len(), 3);
    assert!(
        few_shots[0]
            .as_str()
            .unwrap()
            .contains("Ask Func[genrand]: 0, 19")
    );
    assert!(
        few_shots
            .iter()
            .any(|s| s.as_str().unwrap().contains("Ask Agent["))
    );

    let mut session = open(&client);
    let turn = call(&mut session, "genrand", "0, 19").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("17"));
    assert_eq!(turn.exchanges.len(), 1);
    assert_eq!(&*turn.exchanges[0].label, "POST /genrand");
    assert_eq!(turn.messages.len(), 1);
    assert_eq!(turn.messages[0].name.as_deref(), Some("genrand"));

    // A fork is a copy that calls the same agent.
    let mut fork = session.fork().unwrap();
    let turn = call(&mut fork, "add", "2, 3, -10").await;
    assert_eq!(turn.reply.as_deref(), Some("-5"));

    let turn = call(&mut session, "nope", "x").await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Http4xx);
    assert!(
        fault
            .message
            .starts_with("Func[nope] does not exist on the agent"),
        "{fault:?}"
    );
    assert!(fault.message.contains("doesn't exist"), "{fault:?}");

    let turn = call(&mut session, "fail", "x").await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Http5xx);
    assert!(
        fault
            .message
            .starts_with("Func[fail] failed inside the agent"),
        "{fault:?}"
    );
    assert!(fault.message.contains("Internal Server Error"), "{fault:?}");

    // A function that gets input it cannot use raises too.
    let turn = call(&mut session, "genrand", "ten to twenty").await;
    assert_eq!(turn.fault.unwrap().category, FaultCategory::Http5xx);

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn builtin_numbers_rejects_what_the_sdk_rejects() {
    let server = builtin::serve("numbers").await.unwrap();
    let http = trellis_engine::transport::tls::client_builder()
        .unwrap()
        .no_proxy()
        .build()
        .unwrap();
    let base = server.url();

    let missing = http
        .post(format!("{base}/add"))
        .header("content-type", "application/json")
        .body(r#"{"text":"1, 2"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 422);
    let body: Value = serde_json::from_slice(&missing.bytes().await.unwrap()).unwrap();
    assert_eq!(body["detail"][0]["loc"], json!(["body", "message"]));
    assert_eq!(body["detail"][0]["type"], "value_error.missing");

    let get = http.get(format!("{base}/add")).send().await.unwrap();
    assert_eq!(get.status(), 405);

    let unknown = http
        .post(format!("{base}/nope"))
        .body(r#"{"message":{"text":""}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: Value = serde_json::from_slice(&unknown.bytes().await.unwrap()).unwrap();
    assert_eq!(body, json!({"detail": "Func[nope] doesn't exist"}));

    let ok = http
        .post(format!("{base}/add"))
        .body(r#"{"message":{"text":"40, 2","embeds":{}},"access_token":null}"#)
        .send()
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&ok.bytes().await.unwrap()).unwrap();
    assert_eq!(body, json!({"message": {"text": "42", "embeds": {}}}));

    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn call_sends_the_spec_body_to_the_function_path_with_headers() {
    let (url, seen) = recording(|method, path| match (method, path) {
        ("GET", "/agents/adder/") => HANDSHAKE_JSON.into_response(),
        ("POST", "/agents/adder/add") => {
            json_response(StatusCode::OK, json!({"message": {"text": "2"}}))
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    })
    .await;
    let client = client_with_headers(
        &format!("{url}/agents/adder"),
        vec![("Authorization".into(), "Bearer t0ken".into())],
    );
    client.prepare().await.unwrap();
    let mut session = open(&client);
    let turn = call(&mut session, "add", "1, \"1\"\n").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("2"));

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/agents/adder/")
    );
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("POST", "/agents/adder/add")
    );
    let body: Value = serde_json::from_slice(&seen[1].body).unwrap();
    assert_eq!(body, json!({"message": {"text": "1, \"1\"\n"}}));
    for request in &seen {
        assert_eq!(request.headers["authorization"], "Bearer t0ken");
    }
    assert_eq!(seen[1].headers["content-type"], "application/json");
}

#[tokio::test]
async fn function_names_never_reach_another_path() {
    let (url, seen) = recording(|_, _| StatusCode::OK.into_response()).await;
    let client = client(&url);
    let mut session = open(&client);
    for name in ["../admin", "a/b", "x?y=1", "x#y", "%2e%2e", "", ".."] {
        let turn = call(&mut session, name, "hi").await;
        let fault = turn.fault.unwrap();
        assert_eq!(fault.category, FaultCategory::Protocol, "{name:?}");
        assert!(fault.message.contains("cannot call Func["), "{fault:?}");
        assert!(turn.exchanges[0].attempts.is_empty(), "{name:?} was sent");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn rejected_body_is_a_fault_naming_the_function_with_the_detail() {
    let (url, _) = recording(|_, _| {
        json_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"detail": [{"loc": ["body", "message"], "msg": "field required", "type": "value_error.missing"}]}),
        )
    })
    .await;
    let turn = call(&mut open(&client(&url)), "lookup", "x").await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Http4xx);
    assert!(
        fault
            .message
            .starts_with("Func[lookup] rejected the request body"),
        "{fault:?}"
    );
    assert!(fault.message.contains("field required"), "{fault:?}");
}

#[tokio::test]
async fn plain_text_500_is_a_fault_naming_the_function_and_is_retried() {
    let (url, seen) = recording(|_, _| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            "Internal Server Error",
        )
            .into_response()
    })
    .await;
    let client = FixieClient::new(
        &url,
        Vec::new(),
        CallLimits::default(),
        RetryPolicy {
            retries: 1,
            after_send: false,
        },
        HttpTransport::new(),
    )
    .unwrap();
    let turn = call(&mut open(&client), "explode", "x").await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Http5xx);
    assert!(
        fault
            .message
            .starts_with("Func[explode] failed inside the agent (it raised): HTTP 500"),
        "{fault:?}"
    );
    assert_eq!(turn.exchanges[0].attempts.len(), 2);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn extra_fields_are_tolerated_and_embeds_kept() {
    let (url, _) = recording(|_, _| {
        json_response(
            StatusCode::OK,
            json!({
                "message": {
                    "text": "Here is your chart.",
                    "embeds": {"chart": {"content_type": "image/png", "uri": "https://example.com/c.png"}},
                    "sender": "agent",
                },
                "error": null,
                "trace_id": "abc",
            }),
        )
    })
    .await;
    let turn = call(&mut open(&client(&url)), "chart", "sales").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("Here is your chart."));
    let parts = &turn.messages[0].parts;
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["type"], "embed");
    assert_eq!(parts[0]["name"], "chart");
    assert_eq!(parts[0]["embed"]["content_type"], "image/png");
}

#[tokio::test]
async fn malformed_answers_are_faults_naming_the_function() {
    for (body, category, says) in [
        (
            "not json",
            FaultCategory::InvalidJson,
            "Func[f] answered with a body that is not JSON",
        ),
        (
            r#"{"result":"x"}"#,
            FaultCategory::Protocol,
            "Func[f] answered without a `message` object",
        ),
        (
            r#"{"message":{"text":7}}"#,
            FaultCategory::Protocol,
            "`message.text` as a number",
        ),
        (
            r#"{"message":{"text":"partial"},"error":{"code":"ERR_X","message":"boom","details":null}}"#,
            FaultCategory::AgentError,
            "Func[f] answered with an error: ERR_X: boom",
        ),
    ] {
        let (url, _) = recording(move |_, _| body.into_response()).await;
        let turn = call(&mut open(&client(&url)), "f", "x").await;
        let fault = turn.fault.unwrap();
        assert_eq!(fault.category, category, "{body}: {fault:?}");
        assert!(fault.message.contains(says), "{body}: {fault:?}");
    }
}

#[tokio::test]
async fn yaml_handshake_with_extra_fields_is_read_and_recorded() {
    // What fixieai 1.x sends: `yaml.dump` of its metadata, streamed as application/yaml.
    let yaml = "base_prompt: I am a simple dummy agent.\n\
                conversational: true\n\
                corpora: null\n\
                few_shots:\n\
                - 'Q: Sample query 1\n\n  Ask Func[simple1]: Simple argument\n\n  Func[simple1] says: Simple response\n\n  A: Simple final response'\n\
                - \"Q: Sample query 2\\nAsk Func[simple2]: Simple argument\\nFunc[simple2] says: Simple response\\nA: Simple final response\"\n\
                llm_settings:\n  temperature: 0.0\n";
    let (url, _) =
        recording(move |_, _| ([("content-type", "application/yaml")], yaml).into_response()).await;
    let info = client(&url).prepare().await.unwrap().unwrap();
    assert_eq!(info["format"], "yaml");
    assert_eq!(info["base_prompt"], "I am a simple dummy agent.");
    assert_eq!(
        info["few_shots"],
        json!([
            "Q: Sample query 1\nAsk Func[simple1]: Simple argument\nFunc[simple1] says: Simple response\nA: Simple final response",
            "Q: Sample query 2\nAsk Func[simple2]: Simple argument\nFunc[simple2] says: Simple response\nA: Simple final response",
        ])
    );
    assert_eq!(info["extra"]["conversational"], true);
    assert_eq!(info["extra"]["llm_settings"]["temperature"], 0.0);
}

#[tokio::test]
async fn handshake_failures_are_setup_faults_saying_what_went_wrong() {
    let cases: [(StatusCode, &'static str, &str); 7] = [
        (
            StatusCode::OK,
            "{ \"base_prompt\": [unclosed",
            "neither JSON",
        ),
        // A page reads as a YAML string: said as the page it is.
        (
            StatusCode::OK,
            "<html><body>Welcome</body></html>",
            "the answer is an HTML page: Welcome, not the agent's base prompt",
        ),
        (
            StatusCode::OK,
            "<!DOCTYPE html><html><head><title>Sign in</title></head><body>x</body></html>",
            "the answer is an HTML page (Sign in)",
        ),
        (StatusCode::OK, "just some text", "expected a mapping"),
        (
            StatusCode::OK,
            r#"{"base_prompt":"p"}"#,
            "has no `few_shots`",
        ),
        (
            StatusCode::FORBIDDEN,
            r#"{"detail":"Not authenticated"}"#,
            "the agent wants credentials",
        ),
        (
            StatusCode::NOT_FOUND,
            r#"{"detail":"Not Found"}"#,
            "HTTP 404",
        ),
    ];
    for (status, body, says) in cases {
        let (url, _) = recording(move |_, _| (status, body).into_response()).await;
        let fault = client(&url).prepare().await.unwrap_err();
        assert!(
            fault.message.contains("Fixie handshake `GET /`"),
            "{fault:?}"
        );
        assert!(fault.message.contains(says), "{body}: {fault:?}");
    }
}

#[tokio::test]
async fn user_steps_without_a_provider_and_agent_openings_are_clear_faults() {
    let (url, seen) = recording(|_, _| StatusCode::OK.into_response()).await;
    let mut session = open(&client(&url));
    let ctx = ctx(0);
    let turn = session.turn(TurnInput::User("hello"), &ctx).await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Setup);
    assert!(fault.message.contains("playing Fixie's LLM"), "{fault:?}");
    let turn = session.turn(TurnInput::Opening, &ctx).await;
    let fault = turn.fault.unwrap();
    assert_eq!(fault.category, FaultCategory::Protocol);
    assert!(fault.message.contains("never speaks first"), "{fault:?}");
    assert!(seen.lock().unwrap().is_empty());
}
