//! Driving one turn of a session: wait for a call slot, take the turn within the
//! trajectory's time budget, and record what the protocol reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::ms;
use super::walk::{PathState, Unit};
use crate::protocol::{BranchRequest, CallContext, Session, Turn, TurnInput};
use crate::record::{AttemptRecord, ExchangeRecord, Fault, FaultCategory, TurnRecord};
use crate::transport::http::{RunStop, droppable_while_rate_limited};
use crate::transport::trace::{self, SpanId, TraceContext};

impl Unit<'_> {
    /// An agent's 404 or 405 usually means its `url` names the host but not the endpoint
    /// (`http://host:8000` for `…/agent/respond`): said on the fault, once per turn. Not for
    /// a model's API, whose 404 names an unknown model.
    fn hint_at_the_path(&self, fault: &mut crate::record::Fault) {
        let agent = &self.shared.plan.agents[self.agent];
        if fault.category == FaultCategory::Http4xx
            && (fault.message.starts_with("HTTP 404") || fault.message.starts_with("HTTP 405"))
            && !agent.protocol.capabilities().model_api
        {
            fault
                .message
                .push_str(" (is the agent's `url` its whole endpoint, path included?)");
        }
    }

    /// The agent's `header` values that read the turn's variables, rendered with them
    /// (`None` when it has none); a template or a value that is no header value is the
    /// turn's `template` fault.
    fn turn_headers(&self, state: &PathState) -> Result<Option<HeaderMap>, Fault> {
        let agent = &self.shared.plan.agents[self.agent];
        if agent.turn_headers.is_empty() {
            return Ok(None);
        }
        let fault = |name: &str, why: String| {
            Fault::new(FaultCategory::Template, format!("header `{name}`: {why}"))
        };
        let mut headers = HeaderMap::with_capacity(agent.turn_headers.len());
        for (name, template) in &agent.turn_headers {
            let value = self
                .shared
                .plan
                .templates
                .render(template, || self.scenario.scope.with_vars(&state.vars))
                .map_err(|e| fault(name, e.to_string()))?;
            let header = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|e| fault(name, format!("not a header name: {e}")))?;
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                fault(
                    name,
                    "the rendered value is not a header value (a line break or a control \
                     character)"
                        .into(),
                )
            })?;
            // As the agent's other header values: never printed (they may hold `env`'s).
            value.set_sensitive(true);
            headers.append(header, value);
        }
        Ok(Some(headers))
    }

    /// The agent's `system-prompt` rendered with the turn's variables, when it reads them
    /// (`None` when it is rendered once per run, or there is none); a template that fails
    /// is the turn's `template` fault, as a header's.
    fn turn_system_prompt(&self, state: &PathState) -> Result<Option<String>, Fault> {
        let agent = &self.shared.plan.agents[self.agent];
        let Some(template) = agent
            .settings
            .system_prompt()
            .filter(|_| agent.system_prompt_per_turn)
        else {
            return Ok(None);
        };
        self.shared
            .plan
            .templates
            .render(template, || self.scenario.scope.with_vars(&state.vars))
            .map(Some)
            .map_err(|e| Fault::new(FaultCategory::Template, format!("system-prompt: {e}")))
    }

    /// Takes one turn on `session`, with the fork the agent asked for in it, if any; `None`
    /// when the run is stopping (nothing was sent, or the call was dropped while it waited
    /// out a rate limit past the stop's grace period).
    pub(super) async fn take_turn(
        &self,
        session: &mut dyn Session,
        input: TurnInput<'_>,
        turn_index: u32,
        replay: bool,
        state: &mut PathState,
    ) -> Option<(TurnRecord, Option<BranchRequest>)> {
        let stop = &self.shared.stop;
        if stop.is_cancelled() {
            return None;
        }
        let _agent_permit = match self.agent_limit() {
            Some(limit) => tokio::select! {
                permit = limit.acquire() => permit.ok(),
                () = stop.cancelled() => return None,
            },
            None => None,
        };
        let _call_permit = tokio::select! {
            permit = self.shared.calls.acquire() => permit.ok(),
            () = stop.cancelled() => return None,
        };
        // An agent whose own model runs on a provider's server takes one of its slots for the
        // turn: its model calls then never queue behind a judge's on a one-slot server. The
        // wait is not the agent's time. Boxed: the slot's wait (a rate limiter's) is most of
        // this future's size, and every turn's future was that large for the few agents
        // that take one (docs/performance.md, "What was slow, and why it is not any more").
        let _model_slot = match self.model_server() {
            Some(server) => tokio::select! {
                permit = Box::pin(server.slot()) => Some(permit),
                () = stop.cancelled() => return None,
            },
            None => None,
        };
        let started = Instant::now();
        // The trajectory's budget counts only its own steps, so how long it waited behind
        // sibling branches for a slot never decides whether it timed out.
        let deadline =
            self.scenario.scenario.timeout.and_then(|t| {
                tokio::time::Instant::now().checked_add(t.saturating_sub(state.active))
            });
        // What the turn renders for the agent: nothing is sent when either fails.
        let for_turn = self
            .turn_headers(state)
            .and_then(|headers| Ok((headers, self.turn_system_prompt(state)?)));
        let rendered = for_turn.as_ref().ok();
        let ctx = CallContext {
            test_case_id: self
                .scenario
                .scenario
                .test_case_id
                .as_ref()
                .map_or(&self.scenario.scenario.id.value, |id| &id.value),
            turn_index,
            deadline,
            turn_headers: rendered.and_then(|(headers, _)| headers.as_ref()),
            system_prompt: rendered.and_then(|(_, prompt)| prompt.as_deref()),
            llm_meter: self.shared.plan.agents[self.agent]
                .protocol
                .capabilities()
                .model_api
                .then(|| self.shared.llm.meter()),
        };
        let vars = &state.vars;
        session.set_template_scope(&|| self.scenario.scope.with_vars(vars));
        // The turn's own span: every request of it carries it in `traceparent`.
        let shared = &self.shared;
        let span_id = SpanId::random();
        let trace = TraceContext {
            trace_id: shared.trace.trace_id,
            span_id,
            tracestate: shared.trace.tracestate.clone(),
        };
        let span_hex = span_id.hex();
        if let Some(store) = &shared.spans {
            store.expect_turn(
                &span_hex,
                shared.spans_from_every_agent || self.agent_spans(),
            );
        }
        // Dropped with the call when the run abandons it: said in the run's end.
        let in_flight = InFlight {
            unit: self,
            node: state.nodes.last().map(|n| &**n),
            turn_index,
            input: &input,
            started,
        };
        let mut turn = match for_turn {
            Ok(_) => match droppable_while_rate_limited(
                Arc::clone(shared) as Arc<dyn RunStop>,
                trace::scope(&trace, session.turn(input, &ctx)),
            )
            .await
            {
                Some(turn) => turn,
                None => {
                    if let Some(store) = &shared.spans {
                        store.forget_turn(&span_hex);
                    }
                    return None;
                }
            },
            // Nothing is sent with a header or a system prompt that could not be rendered.
            Err(fault) => Turn::failed(fault),
        };
        std::mem::forget(in_flight);
        if turn.unsent {
            return None;
        }
        let elapsed = started.elapsed();
        let took = elapsed.saturating_sub(turn.queued());
        let started_ms = ms(started.duration_since(shared.run_start));
        let branch = turn.branch.take();
        let spans_for_reuse = turn.spans_for_reuse.take();
        let mut record = record(turn, input, turn_index, started_ms, replay);
        if let Some(fault) = &mut record.fault {
            self.hint_at_the_path(fault);
        }
        // Retries and rate-limit waits are in no latency; the turn's wall time has them. A
        // turn answered from the records (`trellis watch`) took no time of this run.
        record.ended_ms = Some(if record.reused {
            started_ms
        } else {
            started_ms + ms(elapsed)
        });
        // A turn answered from the records took the agent the time it took then, its waits
        // included: the trajectory's duration and its `timeout` count that, not the
        // microseconds of the lookup.
        state.active += if record.reused {
            spans_for_reuse
                .as_ref()
                .and_then(|kept| kept.took.get().copied())
                .or_else(|| Duration::try_from_secs_f64(record.latency_ms / 1000.0).ok())
                .unwrap_or(took)
        } else {
            took
        };
        record.trace_id = Some(shared.trace_hex.clone());
        let mut span_id = span_hex.clone();
        match &spans_for_reuse {
            // The ids its requests carried when the agent answered it, as its spans name.
            Some(kept) if record.reused => {
                if let Some((trace, span)) = kept.ids.get() {
                    record.trace_id = Some(trace.clone());
                    span_id.clone_from(span);
                }
            }
            Some(kept) => {
                let _ = kept.ids.set((shared.trace_hex.clone(), span_hex.clone()));
                let _ = kept.took.set(took);
            }
            None => {}
        }
        // The agent's spans, for checks on them: waited for with the call slots given
        // back, so a slow exporter delays only this conversation, never other calls.
        let unreached = record
            .fault
            .as_ref()
            .is_some_and(|f| f.category == FaultCategory::Connect);
        if record.reused {
            // No request was sent: the spans are those the agent sent when it answered.
            if let Some(store) = &shared.spans {
                store.forget_turn(&span_hex);
            }
            if let Some(spans) = spans_for_reuse.as_ref().and_then(|s| s.spans.get()) {
                record.spans = spans.clone();
            }
        } else if let Some(store) = shared.spans.as_ref().filter(|_| unreached) {
            store.forget_turn(&span_hex);
        } else if let Some(store) = shared.spans.as_ref().filter(|_| self.agent_spans()) {
            drop((_agent_permit, _call_permit, _model_slot));
            // Boxed: the wait's state is then no part of every turn's future, only of
            // the turns that wait.
            record.spans =
                Box::pin(wait_for_spans(store, &span_hex, shared.spans_wait, stop)).await;
            // The stop cut the wait short: checks on the spans do without them.
            if record.spans.is_empty() && stop.is_cancelled() {
                shared.note_cut_short();
            }
            let reached = shared.agent_got_spans(self.agent_id(), !record.spans.is_empty());
            // A wait of zero was asked for: nothing was waited out, nothing to explain.
            if record.spans.is_empty()
                && !stop.is_cancelled()
                && !shared.spans_wait.is_zero()
                && let Some(notices) = &shared.spans_notices
            {
                let refused = store.refused();
                (notices.0)(crate::otel::SpansNotice::TurnGotNone {
                    agent: self.agent_id(),
                    wait: shared.spans_wait,
                    foreign: store.foreign(),
                    refused: refused.as_ref().map(|(n, why)| (*n, why.as_str())),
                    reached,
                });
            }
            if let Some(kept) = &spans_for_reuse {
                let _ = kept.spans.set(record.spans.clone());
            }
        }
        record.span_id = Some(span_id);
        Some((record, branch))
    }
}

/// The agent's spans of the turn `span_hex`, waited for up to `wait`; what arrived when the
/// run stops.
async fn wait_for_spans(
    store: &crate::otel::SpanStore,
    span_hex: &str,
    wait: std::time::Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> Vec<crate::record::SpanRecord> {
    tokio::select! {
        (spans, _) = store.take_turn(span_hex, wait) => spans,
        () = stop.cancelled() => Vec::new(),
    }
}

/// The record of a turn. The flat fields summarise the exchanges (latency and attempts
/// summed, time to first token of the first exchange); `exchanges` lists them only when
/// they say more than that (several requests, retries, a fault, a streamed answer).
fn record(
    turn: Turn,
    input: TurnInput<'_>,
    turn_index: u32,
    started_ms: f64,
    replay: bool,
) -> TurnRecord {
    let usage = turn.usage().unwrap_or_default();
    let tokens_partial = turn.tokens_partial();
    let latency: Duration = turn.exchanges.iter().map(|e| e.latency()).sum();
    let attempts: usize = turn.exchanges.iter().map(|e| e.attempts.len()).sum();
    let ttft = turn.exchanges.first().and_then(|e| e.ttft);
    let detailed = turn.exchanges.len() > 1
        || attempts > turn.exchanges.len()
        || turn
            .exchanges
            .iter()
            .any(|e| e.attempts.iter().any(|a| a.fault.is_some()));
    let exchanges = if detailed {
        turn.exchanges
            .iter()
            .map(|e| ExchangeRecord {
                label: e.label.to_string(),
                latency_ms: ms(e.latency()),
                ttft_ms: e.ttft.map(ms),
                attempts: e
                    .attempts
                    .iter()
                    .map(|a| AttemptRecord {
                        latency_ms: ms(a.latency),
                        fault: a.fault.clone(),
                    })
                    .collect(),
            })
            .collect()
    } else {
        Vec::new()
    };
    TurnRecord {
        turn_index,
        kind: input.kind().to_owned(),
        function: match input {
            TurnInput::Call { function, .. } => Some(function.to_owned()),
            _ => None,
        },
        replay,
        reused: turn.reused,
        user_message: input.text().to_owned(),
        reply: turn.reply,
        messages: turn.messages,
        data: turn.data,
        metadata: turn.metadata,
        tool_calls: turn.tool_calls,
        started_ms,
        latency_ms: ms(latency),
        ended_ms: None,
        ttft_ms: ttft.map(ms),
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        total_tokens: usage.total_tokens,
        tokens_partial,
        cost_usd: usage.cost,
        model: turn.model,
        provider: turn.provider,
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        fault: turn.fault,
        exchanges,
        simulator: Vec::new(),
        user_source: None,
        llm: turn.llm,
        trace_id: None,
        span_id: None,
        spans: Vec::new(),
    }
}

/// A turn's agent call under way: dropped before it is answered (the run's calls abandoned
/// at the end of a stop's grace period), it notes which call that was for the run's end,
/// so a person who stopped a run because an agent hung reads which one. Answered, it is
/// forgotten, costing the turn nothing.
struct InFlight<'u, 'a> {
    unit: &'u Unit<'a>,
    node: Option<&'u str>,
    turn_index: u32,
    input: &'u TurnInput<'u>,
    started: Instant,
}

impl Drop for InFlight<'_, '_> {
    fn drop(&mut self) {
        let shared = &self.unit.shared;
        if !shared.abandon.is_cancelled() {
            return;
        }
        let input = match self.input {
            TurnInput::User(text) => text.chars().take(200).collect(),
            TurnInput::Call { function, .. } => format!("call {function}"),
            other => other.kind().to_owned(),
        };
        let call = crate::record::AbandonedCall {
            suite: self.unit.scenario.suite.to_string(),
            scenario: self.unit.scenario.scenario.id.value.clone(),
            agent: self.unit.agent_id().to_owned(),
            repetition: self.unit.repetition,
            node: self.node.unwrap_or_default().to_owned(),
            turn_index: self.turn_index,
            input,
            waited_ms: ms(self.started.elapsed()),
        };
        if let Ok(mut calls) = shared.abandoned.lock() {
            calls.push(call);
        }
    }
}
