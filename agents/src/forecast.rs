//! `builtin="forecast"`: a weather agent for `protocol="http"` that is instrumented with
//! OpenTelemetry and shows none of its tool calls on the wire, the reference agent for
//! `spans #true` (docs/opentelemetry.md).
//!
//! `POST /chat` takes `{"message": TEXT}` and answers `{"reply": TEXT}`. For `weather in
//! CITY` it looks the city up, then fetches the weather and the local time at once; the
//! calls appear only in its spans: an `invoke_agent forecast` SERVER span continuing the
//! request's W3C `traceparent`, with GenAI `execute_tool` spans under it
//! (`gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.call.arguments`,
//! `gen_ai.tool.call.result`), the two fetches overlapping in time. `refund ORDER` calls
//! `refund`; anything else calls no tool.
//!
//! Spans are exported as OTLP/HTTP protobuf (`opentelemetry-proto` messages) to the endpoint
//! it was started with (the run's receiver, or OTEL_EXPORTER_OTLP_ENDPOINT for `trellis agent
//! forecast --http`) before the answer is sent, as an SDK's simple span processor does, so a
//! run never waits for them. Without an endpoint, or without a `traceparent`, it exports
//! nothing; an export that fails is dropped (an agent's telemetry never fails its answer).

use std::sync::Arc;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span::SpanKind};
use prost::Message as _;
use regex::Regex;
use serde_json::{Value, json};

/// Where the agent answers.
pub const PATH: &str = "/chat";

/// A bound on one export: a receiver that hangs must not hold the answer for long.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

static CITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\bweather\s+(?:in|for)\s+([a-z][a-z' \-]*[a-z])")
        .expect("the city pattern is a valid regex")
});
static REFUND: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\brefund\s+([A-Za-z0-9-]+)").expect("the refund pattern is a valid regex")
});

/// Where spans go, and the client that sends them.
#[derive(Clone)]
struct Exporter {
    traces_url: Option<Arc<str>>,
    client: Option<reqwest::Client>,
}

/// The agent's routes; `otlp` is an OTLP/HTTP base URL (`http://127.0.0.1:4318`), spans
/// going to its `/v1/traces`.
pub fn router(otlp: Option<&str>) -> Router {
    let exporter = Exporter {
        traces_url: otlp.map(|base| Arc::from(format!("{}/v1/traces", base.trim_end_matches('/')))),
        // Only ever a loopback http receiver; without a TLS setup the client cannot be
        // built, and then spans are simply not sent.
        client: trellis_engine::transport::tls::client_builder()
            .ok()
            .and_then(|b| b.build().ok()),
    };
    Router::new().route(PATH, post(chat)).with_state(exporter)
}

/// The spans of one answer.
struct Trace {
    trace_id: Vec<u8>,
    root_id: Vec<u8>,
    spans: Vec<Span>,
}

impl Trace {
    fn tool(&mut self, call: &ToolCall, started: u64, ended: u64) {
        let attributes = vec![
            text("gen_ai.operation.name", "execute_tool"),
            text("gen_ai.tool.name", call.name),
            text("gen_ai.tool.call.id", &call.id),
            text("gen_ai.tool.call.arguments", &call.arguments.to_string()),
            text("gen_ai.tool.call.result", &call.result.to_string()),
        ];
        self.spans.push(Span {
            trace_id: self.trace_id.clone(),
            span_id: random_id(),
            parent_span_id: self.root_id.clone(),
            name: format!("execute_tool {}", call.name),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: started,
            end_time_unix_nano: ended,
            attributes,
            ..Span::default()
        });
    }
}

struct ToolCall {
    name: &'static str,
    id: String,
    arguments: Value,
    result: Value,
}

async fn chat(State(exporter): State<Exporter>, headers: HeaderMap, body: String) -> Response {
    let started = now();
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned));
    let Some(message) = message else {
        return (
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"error": "expected {\"message\": TEXT}"})),
        )
            .into_response();
    };
    let parent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(trellis_engine::transport::trace::parse_traceparent);
    let mut trace = parent.map(|(trace_id, _)| Trace {
        trace_id: trace_id.0.to_vec(),
        root_id: random_id(),
        spans: Vec::new(),
    });
    let reply = answer(&message, trace.as_mut()).await;
    if let (Some(mut trace), Some((_, parent)), Some(url)) =
        (trace, parent, exporter.traces_url.as_deref())
    {
        trace.spans.push(Span {
            trace_id: trace.trace_id.clone(),
            span_id: trace.root_id.clone(),
            parent_span_id: parent.0.to_vec(),
            name: "invoke_agent forecast".to_owned(),
            kind: SpanKind::Server as i32,
            start_time_unix_nano: started,
            end_time_unix_nano: now(),
            attributes: vec![
                text("gen_ai.operation.name", "invoke_agent"),
                text("gen_ai.agent.name", "forecast"),
            ],
            ..Span::default()
        });
        if let Some(client) = &exporter.client {
            export(client, url, trace.spans).await;
        }
    }
    axum::Json(json!({"reply": reply})).into_response()
}

/// The reply, with the tool calls recorded on `trace`.
async fn answer(message: &str, mut trace: Option<&mut Trace>) -> String {
    if let Some(city) = CITY.captures(message).and_then(|c| c.get(1)) {
        let city = city.as_str().to_owned();
        let args = json!({"city": city});
        let lookup = ToolCall {
            name: "lookup_city",
            id: "call_1".into(),
            arguments: args.clone(),
            result: json!({"id": city.to_lowercase()}),
        };
        let t0 = now();
        tokio::task::yield_now().await;
        if let Some(trace) = trace.as_deref_mut() {
            trace.tool(&lookup, t0, now());
        }
        // Both fetches at once: their spans overlap, which is what makes them parallel.
        let timed = |call: ToolCall| async move {
            let started = now();
            tokio::time::sleep(Duration::from_millis(3)).await;
            (call, started, now())
        };
        let (weather, time) = tokio::join!(
            timed(ToolCall {
                name: "get_weather",
                id: "call_2".into(),
                arguments: args.clone(),
                result: json!({"sky": "sunny", "celsius": 21}),
            }),
            timed(ToolCall {
                name: "get_time",
                id: "call_3".into(),
                arguments: args,
                result: json!({"time": "12:00"}),
            }),
        );
        if let Some(trace) = trace {
            trace.tool(&weather.0, weather.1, weather.2);
            trace.tool(&time.0, time.1, time.2);
        }
        return format!("It is sunny and 21°C in {city}; the local time is 12:00.");
    }
    if let Some(order) = REFUND.captures(message).and_then(|c| c.get(1)) {
        let order = order.as_str();
        let call = ToolCall {
            name: "refund",
            id: "call_1".into(),
            arguments: json!({"order": order}),
            result: json!({"ok": true}),
        };
        let t0 = now();
        if let Some(trace) = trace {
            trace.tool(&call, t0, now());
        }
        return format!("Order {order} is refunded.");
    }
    "I can tell you the weather in a city, or refund an order.".to_owned()
}

async fn export(client: &reqwest::Client, url: &str, spans: Vec<Span>) {
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![text("service.name", "forecast")],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "trellis-agents/forecast".to_owned(),
                    ..InstrumentationScope::default()
                }),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    };
    // A receiver that is down or slow costs this answer at most the timeout, never an error.
    let _ = client
        .post(url)
        .header("content-type", "application/x-protobuf")
        .timeout(EXPORT_TIMEOUT)
        .body(request.encode_to_vec())
        .send()
        .await;
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

fn random_id() -> Vec<u8> {
    trellis_engine::transport::trace::SpanId::random()
        .0
        .to_vec()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
