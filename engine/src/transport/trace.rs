//! W3C Trace Context for the requests a turn makes: every HTTP request sent while a turn's
//! [`TraceContext`] is in scope carries `traceparent` (and `tracestate` when the run was
//! given one), so an instrumented agent's spans join Trellis's trace as children of the
//! turn's span.
//!
//! The context travels as a tokio task-local rather than a parameter: every protocol sends
//! through [`super::http::HttpTransport::send`], so the header is added in one place and no
//! protocol or codec needs to know about tracing. Requests made outside a turn (judges, the
//! simulated user) carry none.
//!
//! Ids are random (`fastrand`, seeded from the OS): trace ids only have to be unique, not
//! secret, and drawing one costs nanoseconds, so every run gets them whether or not anything
//! collects spans.

use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// `traceparent`: version, trace id, parent span id, flags.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`: vendors' opaque state, passed on as received.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// A 16-byte trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A random id, never all zeros (which W3C reserves for "invalid").
    pub fn random() -> Self {
        loop {
            let id = fastrand::u128(..).to_be_bytes();
            if id != [0; 16] {
                return TraceId(id);
            }
        }
    }

    /// 32 lowercase hex digits, as `traceparent` and OTLP/JSON write it.
    pub fn hex(&self) -> String {
        let mut digits = [0; 32];
        hex_into(&self.0, &mut digits);
        ascii(&digits)
    }
}

impl SpanId {
    /// A random id, never all zeros.
    pub fn random() -> Self {
        loop {
            let id = fastrand::u64(..).to_be_bytes();
            if id != [0; 8] {
                return SpanId(id);
            }
        }
    }

    /// 16 lowercase hex digits.
    pub fn hex(&self) -> String {
        let mut digits = [0; 16];
        hex_into(&self.0, &mut digits);
        ascii(&digits)
    }
}

/// `bytes` as lowercase hex digits into `out`, twice as long. A turn writes its span's
/// digits twice (its `traceparent`, its record's span id): `hex::encode` goes a `char` at a
/// time through an iterator, about 1,200 instructions for a trace id, this about 100.
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    // Fails only when `out` is not twice `bytes`, which the callers' arrays rule out.
    let _ = hex::encode_to_slice(bytes, out);
}

/// ASCII bytes (hex digits) as a `String`.
fn ascii(bytes: &[u8]) -> String {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .unwrap_or_default()
}

/// Where a run's trace comes from: a fresh trace, or the caller's (`TRACEPARENT` in the
/// environment, as a CI job traced by its runner sets it), whose span becomes the run's
/// parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: TraceId,
    /// The run span's own id.
    pub run_span: SpanId,
    /// The caller's span, when the run continues a trace.
    pub parent: Option<SpanId>,
    /// `tracestate` to pass on unchanged, when the caller gave one.
    pub tracestate: Option<Arc<str>>,
}

impl RunTrace {
    /// A run's trace: continues `traceparent` when it is a valid version-00 header (a
    /// malformed one is ignored, as the W3C spec asks of a receiver), else starts anew.
    pub fn new(traceparent: Option<&str>, tracestate: Option<&str>) -> Self {
        let parsed = traceparent.and_then(parse_traceparent);
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && HeaderValue::from_str(s).is_ok())
            .map(Arc::from);
        match parsed {
            Some((trace_id, parent)) => RunTrace {
                trace_id,
                run_span: SpanId::random(),
                parent: Some(parent),
                tracestate,
            },
            None => RunTrace {
                trace_id: TraceId::random(),
                run_span: SpanId::random(),
                parent: None,
                tracestate: None,
            },
        }
    }

    /// The run's trace, continuing `TRACEPARENT`/`TRACESTATE` from the environment.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok();
        Self::new(var("TRACEPARENT").as_deref(), var("TRACESTATE").as_deref())
    }
}

/// `00-<trace>-<span>-<flags>` → (trace, span); `None` for anything else or all-zero ids.
pub fn parse_traceparent(header: &str) -> Option<(TraceId, SpanId)> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || flags.len() != 2 {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex::decode_to_slice(trace, &mut trace_id).ok()?;
    hex::decode_to_slice(span, &mut span_id).ok()?;
    let lower = |s: &str| !s.bytes().any(|b| b.is_ascii_uppercase());
    if trace_id == [0; 16] || span_id == [0; 8] || !lower(trace) || !lower(span) {
        return None;
    }
    Some((TraceId(trace_id), SpanId(span_id)))
}

/// The trace context of one turn: its trace, the turn's span (the parent the agent's spans
/// name), and the run's `tracestate`.
#[derive(Clone, Debug)]
pub struct TraceContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub tracestate: Option<Arc<str>>,
}

impl TraceContext {
    /// The `traceparent` value: sampled (`01`), since Trellis records every turn.
    pub fn traceparent(&self) -> String {
        ascii(&self.traceparent_bytes())
    }

    /// `traceparent`'s 55 ASCII bytes, `00-<32 hex>-<16 hex>-01`, written in place.
    fn traceparent_bytes(&self) -> [u8; 55] {
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-01";
        hex_into(&self.trace_id.0, &mut out[3..35]);
        hex_into(&self.span_id.0, &mut out[36..52]);
        out
    }
}

/// The headers of a turn, made once per turn: each request of it (retries, tool rounds)
/// only clones them, which shares their bytes.
#[derive(Clone, Debug)]
struct TurnHeaders {
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

tokio::task_local! {
    static CURRENT: TurnHeaders;
}

/// Runs `future` (a turn) with `ctx` as the trace context of every request it sends.
pub async fn scope<F: std::future::Future>(ctx: &TraceContext, future: F) -> F::Output {
    // Hex digits and a state already checked to be a valid header value always convert.
    let headers = HeaderValue::from_bytes(&ctx.traceparent_bytes())
        .ok()
        .map(|traceparent| TurnHeaders {
            traceparent,
            tracestate: ctx
                .tracestate
                .as_deref()
                .and_then(|s| HeaderValue::from_str(s).ok()),
        });
    match headers {
        Some(headers) => CURRENT.scope(headers, future).await,
        None => future.await,
    }
}

/// Adds `traceparent` (and `tracestate`) to `request` when a turn is in scope; a header of
/// that name the agent's own `header` nodes set is replaced, since the turn's span is the
/// only parent the agent's spans can be matched by.
pub(super) fn add_headers(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let headers = CURRENT.try_with(|h| h.clone()).ok();
    match headers {
        None => request,
        Some(TurnHeaders {
            traceparent,
            tracestate,
        }) => {
            let mut map = HeaderMap::with_capacity(2);
            map.insert(TRACEPARENT, traceparent);
            if let Some(state) = tracestate {
                map.insert(TRACESTATE, state);
            }
            // `headers` replaces what the agent's own nodes set under these names.
            request.headers(map)
        }
    }
}

/// [`add_headers`] for a request built by hand ([`super::plain`]).
pub(super) fn insert_headers(map: &mut HeaderMap) {
    let _ = CURRENT.try_with(|h| {
        map.insert(TRACEPARENT, h.traceparent.clone());
        if let Some(state) = &h.tracestate {
            map.insert(TRACESTATE, state.clone());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let ctx = TraceContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            tracestate: None,
        };
        let header = ctx.traceparent();
        assert_eq!(
            header,
            format!(
                "00-{}-{}-01",
                hex::encode(ctx.trace_id.0),
                hex::encode(ctx.span_id.0)
            )
        );
        assert_eq!(ctx.span_id.hex(), hex::encode(ctx.span_id.0));
        assert_eq!(
            parse_traceparent(&header),
            Some((ctx.trace_id, ctx.span_id))
        );
    }

    #[test]
    fn malformed_traceparents_start_a_new_trace() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            let run = RunTrace::new(Some(bad), Some("k=v"));
            assert_eq!(run.parent, None, "{bad}");
            assert_eq!(run.tracestate, None, "{bad}");
        }
        let run = RunTrace::new(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("vendor=x"),
        );
        assert_eq!(run.trace_id.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            run.parent.map(|p| p.hex()).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert_eq!(run.tracestate.as_deref(), Some("vendor=x"));
    }
}
