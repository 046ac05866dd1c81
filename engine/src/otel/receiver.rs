//! The run's OTLP/HTTP trace receiver: `POST /v1/traces` with a protobuf
//! (`application/x-protobuf`) or JSON (`application/json`) `ExportTraceServiceRequest`,
//! decoded with the `opentelemetry-proto` messages and flattened into [`SpanRecord`]s for
//! the [`SpanStore`].
//!
//! It answers as the OTLP spec asks (an empty `ExportTraceServiceResponse` in the request's
//! encoding; 400 for a body that does not decode, 415 for another content type or a coding
//! other than gzip and deflate), so an SDK exporter never retries a request we cannot read.
//! A gzip body (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`, which the OTLP spec has every
//! receiver take) is decompressed first. A body over the receiver's limit is refused with
//! 413: at once when its `content-length` says so, else once the limit is passed. Each
//! refusal is counted in the store with its reason, so the run can say why an agent's spans
//! never arrived. The server
//! runs on the runtime that starts it and stops when the receiver is dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode as OtlpStatus};
use prost::Message as _;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::SpanStore;
use crate::record::SpanRecord;

/// The largest export request taken (SDK batches are 512 spans by default, far below).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// Why the receiver could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    #[error("cannot listen for OTLP spans on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A listening receiver. Dropping it stops the server.
pub struct SpanReceiver {
    addr: SocketAddr,
    store: Arc<SpanStore>,
    stop: CancellationToken,
}

impl std::fmt::Debug for SpanReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanReceiver")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for SpanReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SpanReceiver {
    /// Listens on `addr` (port 0: any free port) and serves on the current tokio runtime.
    pub async fn start(addr: SocketAddr) -> Result<Self, ReceiverError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ReceiverError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ReceiverError::Bind { addr, source })?;
        let store = Arc::new(SpanStore::new(String::new()));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(store.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            // A failed accept loop only ends the receiver: the run goes on without spans.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await;
        });
        Ok(SpanReceiver { addr, store, stop })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL for `OTEL_EXPORTER_OTLP_ENDPOINT` (exporters add `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn store(&self) -> &Arc<SpanStore> {
        &self.store
    }
}

enum Encoding {
    Protobuf,
    Json,
}

async fn export(State(store): State<Arc<SpanStore>>, headers: HeaderMap, body: Body) -> Response {
    let refuse = |status: StatusCode, why: String| {
        store.refuse(&why);
        (status, why).into_response()
    };
    // The body is read here rather than by an extractor, so that a body over the limit is
    // refused and counted like every other refusal (axum's own limit answered it unseen).
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "an OTLP export of more than the receiver's limit of {MAX_BODY} bytes: export \
                 fewer spans per request (a smaller batch)"
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(e) => {
            let limited = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if limited {
                return too_large();
            }
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("the OTLP body could not be read: {e}"),
            );
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let encoding = match content_type.split(';').next().map(str::trim) {
        Some("application/x-protobuf" | "application/protobuf") => Encoding::Protobuf,
        Some("application/json") => Encoding::Json,
        _ => {
            return refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "OTLP/HTTP takes application/x-protobuf or application/json, not `{}`",
                    crate::transport::quote::cut(content_type, 80)
                ),
            );
        }
    };
    let coding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if !matches!(
        coding.as_str(),
        "" | "identity" | "gzip" | "x-gzip" | "deflate"
    ) {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "OTLP bodies compressed with `{}` are not accepted, only gzip or deflate: set \
                 OTEL_EXPORTER_OTLP_COMPRESSION=gzip or none",
                crate::transport::quote::cut(&coding, 40)
            ),
        );
    }
    let body = match crate::transport::encoding::decoded(&headers, body, MAX_BODY as u64) {
        Ok(body) => body,
        // The decoder's words are an agent's answer's (`max-response-size`); this is a
        // request to the receiver, whose own limit it passed.
        Err(fault) if fault.category == crate::record::FaultCategory::TooLarge => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the OTLP body decompresses to more than the receiver's limit of {MAX_BODY} \
                     bytes: export fewer spans per request (a smaller batch)"
                ),
            );
        }
        Err(fault) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("the OTLP body does not decompress: {}", fault.message),
            );
        }
    };
    let request = match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string()),
        Encoding::Json => serde_json::from_slice(&body).map_err(|e| e.to_string()),
    };
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("not an OTLP trace export: {e}"),
            );
        }
    };
    store.add(flatten(request));
    match encoding {
        Encoding::Protobuf => (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
            .into_response(),
        Encoding::Json => ([(header::CONTENT_TYPE, "application/json")], "{}").into_response(),
    }
}

/// Every span of an export request, with its resource's `service.name`.
pub(crate) fn flatten(request: ExportTraceServiceRequest) -> Vec<SpanRecord> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans.resource.as_ref().and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .map(text_of)
        });
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                let kind = match SpanKind::try_from(span.kind) {
                    Ok(SpanKind::Internal) => "internal",
                    Ok(SpanKind::Server) => "server",
                    Ok(SpanKind::Client) => "client",
                    Ok(SpanKind::Producer) => "producer",
                    Ok(SpanKind::Consumer) => "consumer",
                    _ => "unspecified",
                };
                let (status, status_message) = match span.status {
                    Some(s) => (
                        match OtlpStatus::try_from(s.code) {
                            Ok(OtlpStatus::Ok) => "ok",
                            Ok(OtlpStatus::Error) => "error",
                            _ => "unset",
                        },
                        Some(s.message).filter(|m| !m.is_empty()),
                    ),
                    None => ("unset", None),
                };
                out.push(SpanRecord {
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex::encode(&span.parent_span_id)),
                    name: span.name,
                    kind: kind.to_owned(),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                    status: status.to_owned(),
                    status_message,
                    service: service.clone(),
                    attributes: attributes(span.attributes),
                });
            }
        }
    }
    out
}

fn attributes(kvs: Vec<KeyValue>) -> Map<String, Value> {
    kvs.into_iter()
        .map(|kv| (kv.key, kv.value.map_or(Value::Null, json_of)))
        .collect()
}

/// OTLP's typed value as plain JSON (bytes as hex).
fn json_of(value: AnyValue) -> Value {
    match value.value {
        Some(any_value::Value::StringValue(s)) => Value::String(s),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(b),
        Some(any_value::Value::IntValue(i)) => Value::from(i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(d),
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.into_iter().map(json_of).collect())
        }
        Some(any_value::Value::KvlistValue(kv)) => Value::Object(attributes(kv.values)),
        Some(any_value::Value::BytesValue(b)) => Value::String(hex::encode(b)),
        _ => Value::Null,
    }
}

fn text_of(value: &AnyValue) -> String {
    match json_of(value.clone()) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const TRACE: &str = "5b8efff798038103d269b633813fc60c";

    /// OTLP/JSON as the spec writes it: hex ids, 64-bit integers as strings, enums as
    /// numbers.
    fn json_export() -> String {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"js-agent"}}}}]}},
            "scopeSpans":[{{"scope":{{"name":"x"}},"spans":[
              {{"traceId":"{TRACE}","spanId":"eee19b7ec3c1b174","parentSpanId":"eee19b7ec3c1b173",
                "name":"execute_tool refund","kind":1,
                "startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
                "attributes":[{{"key":"gen_ai.operation.name","value":{{"stringValue":"execute_tool"}}}},
                              {{"key":"gen_ai.usage.input_tokens","value":{{"intValue":"12"}}}}],
                "status":{{"code":2,"message":"boom"}}}}]}}]}}]}}"#
        )
    }

    /// Writes `head` and then `chunks` chunks of 1 MiB (chunked encoding) to the receiver at
    /// `address`, and reads its answer; a write the receiver cut short by answering ends the
    /// writing.
    async fn raw_exchange(address: SocketAddr, head: &[u8], chunks: usize) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let mut written = stream.write_all(head).await.is_ok();
        let chunk = [b"100000\r\n".as_slice(), &vec![b' '; 1 << 20], b"\r\n"].concat();
        for _ in 0..chunks {
            if !written {
                break;
            }
            written = stream.write_all(&chunk).await.is_ok();
        }
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn json_and_protobuf_exports_are_taken_and_bad_ones_refused() {
        let receiver = SpanReceiver::start(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        receiver.store().begin(TRACE.to_owned());
        receiver.store().expect_turn("eee19b7ec3c1b173", true);
        let url = format!("{}/v1/traces", receiver.endpoint());
        let client = crate::transport::tls::client_builder()
            .unwrap()
            .build()
            .unwrap();
        let post = |ct: &'static str, body: Vec<u8>| {
            client
                .post(&url)
                .header("content-type", ct)
                .body(body)
                .send()
        };
        let ok = post("application/json", json_export().into_bytes())
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.text().await.unwrap(), "{}");
        let (spans, rooted) = receiver
            .store()
            .take_turn("eee19b7ec3c1b173", Duration::from_secs(1))
            .await;
        assert!(rooted);
        let span = &spans[0];
        assert_eq!(span.name, "execute_tool refund");
        assert_eq!(span.kind, "internal");
        assert_eq!(span.status, "error");
        assert_eq!(span.status_message.as_deref(), Some("boom"));
        assert_eq!(span.service.as_deref(), Some("js-agent"));
        assert_eq!(span.attributes["gen_ai.usage.input_tokens"], 12);
        assert_eq!(span.end_unix_nano - span.start_unix_nano, 1_000_000_000);

        // The same export as protobuf.
        let request: ExportTraceServiceRequest = serde_json::from_str(&json_export()).unwrap();
        let ok = post("application/x-protobuf", request.encode_to_vec())
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
        assert!(ExportTraceServiceResponse::decode(ok.bytes().await.unwrap()).is_ok());

        // Field 1 says 5 bytes follow, one does: a truncated message.
        assert_eq!(
            post("application/x-protobuf", vec![0x0a, 0x05, 0x01])
                .await
                .unwrap()
                .status(),
            400
        );
        assert_eq!(
            post("application/json", b"{\"resourceSpans\": 7".to_vec())
                .await
                .unwrap()
                .status(),
            400
        );
        assert_eq!(
            post("text/plain", b"x".to_vec()).await.unwrap().status(),
            415
        );

        // OTEL_EXPORTER_OTLP_COMPRESSION=gzip: taken.
        receiver.store().expect_turn("eee19b7ec3c1b173", true);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &request.encode_to_vec()).unwrap();
        let compressed = |coding: &'static str, body: Vec<u8>| {
            client
                .post(&url)
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", coding)
                .body(body)
                .send()
        };
        let ok = compressed("gzip", gz.finish().unwrap()).await.unwrap();
        assert_eq!(ok.status(), 200);
        let (spans, _) = receiver
            .store()
            .take_turn("eee19b7ec3c1b173", Duration::from_secs(1))
            .await;
        assert_eq!(
            spans.len(),
            2,
            "the protobuf export's span and the gzip one's"
        );
        // A coding it does not take is refused, and the store says why.
        let refused = compressed("zstd", vec![1, 2, 3]).await.unwrap();
        assert_eq!(refused.status(), 415);
        let (n, why) = receiver.store().refused().expect("counted");
        assert_eq!(n, 4, "the two bad bodies, the content type and zstd");
        assert!(why.contains("`zstd`") && why.contains("gzip"), "{why}");

        // A body over the limit: refused before it is read when its length is declared,
        // once the limit is passed when it is chunked; counted either way.
        let (before, _) = receiver.store().refused().expect("counted");
        let address = receiver.addr();
        let declared = format!(
            "POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{{",
            MAX_BODY + 1
        );
        let answer = raw_exchange(address, declared.as_bytes(), 0).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        let chunked = "POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                       transfer-encoding: chunked\r\n\r\n";
        let answer = raw_exchange(address, chunked.as_bytes(), MAX_BODY / (1 << 20) + 2).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        let (after, why) = receiver.store().refused().expect("counted");
        assert_eq!(after, before + 2);
        assert!(why.contains("receiver's limit"), "{why}");

        // A gzip body that inflates past the receiver's limit: 413, said of the receiver's
        // limit, not of an agent's `max-response-size`.
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut bomb, &vec![0u8; MAX_BODY + 1024]).unwrap();
        let refused = compressed("gzip", bomb.finish().unwrap()).await.unwrap();
        assert_eq!(refused.status(), 413);
        let said = refused.text().await.unwrap();
        assert!(
            said.contains("receiver's limit") && !said.contains("max-response-size"),
            "{said}"
        );
    }
}
