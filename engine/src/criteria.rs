//! Deterministic criteria: checks on one turn (`expect`) or on a whole trajectory
//! (`criteria { }`), producing [`CriterionRecord`]s that say what was observed.
//!
//! LLM-judged criteria (`judge`, `outcome`) are recorded as skipped until a judge is
//! configured; they never count as passed.
//!
//! String values of `reply` and `tool` criteria may be templates. The planner compiles them
//! ([`PlannedCriterion`]); [`check_planned`] renders them with the scope of a user message at
//! the same place and checks against the rendered text. Values are compared by
//! [`written_matches`] (the sandbox's rule for mocks too): a literal by JSON equality, a
//! rendered template as text, which also matches a number or boolean argument written that
//! way (`"{{ vars.order }}"` rendering `42` matches `"order": 42`), since captures are
//! strings.

use std::time::Duration;

use serde_json::Value;
use trellis_dsl::{Criterion, CriterionKind, ReplyCheck, ValueSlot};

use crate::plan::PlannedCriterion;
use crate::record::shown::quoted;
use crate::record::{CriterionRecord, CriterionStatus, SpanRecord, ToolCallRecord, TurnRecord};
use crate::render::Templates;
use crate::sandbox::{
    NO_SANDBOX, Sandbox, StateExpectation, TextCase, Written, is_violation_result, written_matches,
};

/// What a criterion looks at: the turn just taken, or every turn of the trajectory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Turn,
    Trajectory,
}

/// Checks `criterion` against the turns of a path so far. With [`Scope::Turn`] the check
/// looks at the last turn, except `turns max=`, which counts every turn so far; with
/// [`Scope::Trajectory`] it looks at all of them. `turn_index` is recorded on turn-level
/// results.
///
/// Templated values are compared as written (braces included): use [`check_planned`] for
/// criteria of a plan.
pub fn check<T: AsRef<TurnRecord>>(
    criterion: &Criterion,
    scope: Scope,
    turns: &[T],
    turn_index: Option<u32>,
) -> CriterionRecord {
    check_rendered(
        criterion,
        &Rendered::default(),
        scope,
        turns,
        turn_index,
        Evidence::default(),
    )
}

/// What a check may look at besides the turns.
#[derive(Clone, Copy, Default)]
pub struct Evidence<'a> {
    /// The trajectory's tool sandbox as it is at this point, for agents whose tools the
    /// engine answers (`state`, `violations`); without one those checks are skipped,
    /// saying why.
    pub sandbox: Option<&'a Sandbox>,
    /// The agent's tool calls are read from its spans (`spans #true`) when its answers
    /// show none: a turn with neither calls nor spans then says nothing about its calls,
    /// and a tool check that needs it is skipped rather than passed or failed.
    pub tools_from_spans: bool,
}

/// Renders the templated values of `planned` with `ctx` (the variables a user message at the
/// same place sees, e.g. `scenario.scope.with_vars(&vars)`), then checks it like [`check`].
/// A value that does not render fails the criterion, saying why; `ctx` is only called when
/// the criterion has a templated value. `evidence` is what else it may look at.
pub fn check_planned<T: AsRef<TurnRecord>>(
    planned: &PlannedCriterion,
    templates: &Templates,
    ctx: impl FnOnce() -> minijinja::Value,
    scope: Scope,
    turns: &[T],
    turn_index: Option<u32>,
    evidence: Evidence<'_>,
) -> CriterionRecord {
    let criterion = &planned.criterion;
    let unchecked = |status, detail| CriterionRecord {
        turn_index,
        criterion: criterion.text.clone(),
        kind: criterion.kind.name().to_string(),
        status,
        detail: Some(detail),
        judge: None,
    };
    let mut rendered = Rendered::default();
    if !planned.templates.is_empty() {
        let ctx = ctx();
        for (slot, template) in &planned.templates {
            match templates.render(template, || ctx.clone()) {
                // A value to check against that is a missing or `null` field is no value:
                // nothing would be checked (an error), whatever the check. Read as the word
                // `null`, `not-contains` passed on every reply; read as the empty text,
                // `equals` passed on an empty reply.
                Ok(text)
                    if text == "null"
                        && matches!(slot, ValueSlot::ReplyCheck(_))
                        && templates.is_null_alone(template, ctx.clone()) =>
                {
                    return unchecked(
                        CriterionStatus::Error,
                        format!(
                            "`{}` is a `null` or missing field: there is no value to check \
                             against, so nothing was checked",
                            template.source().trim()
                        ),
                    );
                }
                Ok(text) => rendered.values.push((slot.clone(), text)),
                Err(e) => {
                    return unchecked(CriterionStatus::Failed, format!("criterion value: {e}"));
                }
            }
        }
    }
    check_rendered(criterion, &rendered, scope, turns, turn_index, evidence)
}

/// The kind of a judged criterion (`judge`, `outcome "…"`) with its statement and its
/// `rubric=` rendered in `ctx` where they are templates ([`ValueSlot::JudgeStatement`],
/// [`ValueSlot::JudgeRubric`]), so the judge reads the values; borrowed as written
/// otherwise. The record keeps the criterion as written.
pub fn judged_kind<'c>(
    planned: &'c PlannedCriterion,
    templates: &Templates,
    ctx: impl FnOnce() -> minijinja::Value,
) -> Result<std::borrow::Cow<'c, CriterionKind>, crate::render::RenderError> {
    let judged =
        |slot: &ValueSlot| matches!(slot, ValueSlot::JudgeStatement | ValueSlot::JudgeRubric);
    if !planned.templates.iter().any(|(slot, _)| judged(slot)) {
        return Ok(std::borrow::Cow::Borrowed(&planned.criterion.kind));
    }
    let ctx = ctx();
    let mut kind = planned.criterion.kind.clone();
    for (slot, template) in planned.templates.iter().filter(|(slot, _)| judged(slot)) {
        let text = templates.render(template, || ctx.clone())?;
        if let Some(value) = crate::render::judged_value(&mut kind, slot) {
            *value = text;
        }
    }
    Ok(std::borrow::Cow::Owned(kind))
}

/// The record of a judged check whose statement could not be rendered: an error of the
/// check (its judge was never asked), as a judge that failed is.
pub fn unrendered_statement(
    criterion: &Criterion,
    turn_index: Option<u32>,
    error: &crate::render::RenderError,
) -> CriterionRecord {
    CriterionRecord {
        turn_index,
        criterion: criterion.text.clone(),
        kind: criterion.kind.name().to_string(),
        status: CriterionStatus::Error,
        detail: Some(crate::render::unrendered_detail(error)),
        judge: None,
    }
}

/// The rendered templated values of one criterion.
#[derive(Debug, Default)]
struct Rendered {
    values: Vec<(ValueSlot, String)>,
}

impl Rendered {
    fn get(&self, slot: &ValueSlot) -> Option<&str> {
        self.values
            .iter()
            .find(|(s, _)| s == slot)
            .map(|(_, v)| v.as_str())
    }

    fn tool_param(&self, key: &str) -> Option<&str> {
        self.values.iter().find_map(|(s, v)| match s {
            ValueSlot::ToolParam(k) if k == key => Some(v.as_str()),
            _ => None,
        })
    }
}

fn check_rendered<T: AsRef<TurnRecord>>(
    criterion: &Criterion,
    rendered: &Rendered,
    scope: Scope,
    turns: &[T],
    turn_index: Option<u32>,
    evidence: Evidence<'_>,
) -> CriterionRecord {
    let (status, detail) = evaluate(&criterion.kind, rendered, scope, turns, evidence);
    CriterionRecord {
        turn_index,
        criterion: criterion.text.clone(),
        kind: criterion.kind.name().to_string(),
        status,
        detail: detail.map(bounded_detail),
        judge: None,
    }
}

/// A detail quotes what the agent sent (a reply, a call's arguments): bounded, so a 200 KB
/// argument does not make a 200 KB console line and `criteria.detail` cell. The turn's own
/// record keeps the whole text.
const MAX_DETAIL_CHARS: usize = 2_000;

fn bounded_detail(detail: String) -> String {
    // Every check of every turn comes here: a detail of no more bytes than the bound has
    // no more characters either, and is not walked.
    if detail.len() <= MAX_DETAIL_CHARS {
        return detail;
    }
    match detail.char_indices().nth(MAX_DETAIL_CHARS) {
        None => detail,
        Some((cut, _)) => {
            let more = detail[cut..].chars().count();
            format!("{}… ({more} more characters)", &detail[..cut])
        }
    }
}

fn pass(detail: impl Into<String>) -> (CriterionStatus, Option<String>) {
    (CriterionStatus::Passed, Some(detail.into()))
}
fn fail(detail: impl Into<String>) -> (CriterionStatus, Option<String>) {
    (CriterionStatus::Failed, Some(detail.into()))
}
fn skip(detail: impl Into<String>) -> (CriterionStatus, Option<String>) {
    (CriterionStatus::Skipped, Some(detail.into()))
}

fn evaluate<T: AsRef<TurnRecord>>(
    kind: &CriterionKind,
    rendered: &Rendered,
    scope: Scope,
    turns: &[T],
    evidence: Evidence<'_>,
) -> (CriterionStatus, Option<String>) {
    let sandbox = evidence.sandbox;
    let spans = evidence.tools_from_spans;
    let all: Vec<&TurnRecord> = turns.iter().map(AsRef::as_ref).collect();
    let turns: &[&TurnRecord] = match scope {
        Scope::Turn => all.last().map(std::slice::from_ref).unwrap_or_default(),
        Scope::Trajectory => &all,
    };
    match kind {
        CriterionKind::Reply(checks) => {
            for (i, check) in checks.iter().enumerate() {
                let value = rendered.get(&ValueSlot::ReplyCheck(i));
                // Every reply contains the empty text (and so none passes `not-contains`):
                // a value that rendered empty (an empty dataset cell, a capture of nothing)
                // would check nothing.
                if let (ReplyCheck::Contains(_) | ReplyCheck::NotContains(_), Some("")) =
                    (check, value)
                {
                    return (
                        CriterionStatus::Error,
                        Some(
                            "the text to look for rendered empty (an empty field, a capture of \
                             nothing), and every reply contains the empty text: nothing was \
                             checked"
                                .to_string(),
                        ),
                    );
                }
                if let Some(failure) = reply_check(check, value, scope, turns) {
                    return fail(failure);
                }
            }
            // On the whole trajectory, the reply quoted is one that holds the first check
            // (the last such), not merely the last reply.
            let shown = match (scope, checks.first()) {
                (Scope::Trajectory, Some(first)) => turns.iter().rev().find(|t| {
                    t.reply.as_deref().is_some_and(|r| {
                        holds(first, rendered.get(&ValueSlot::ReplyCheck(0)), r) == Some(true)
                    })
                }),
                _ => None,
            };
            pass(match shown {
                Some(turn) => format!(
                    "turn {} reply: {}",
                    turn.turn_index,
                    excerpt(turn.reply.as_deref().unwrap_or_default(), 120)
                ),
                None => match turns.last().and_then(|t| t.reply.as_deref()) {
                    Some(reply) => format!("reply: {}", excerpt(reply, 120)),
                    None => "no reply".to_string(),
                },
            })
        }
        CriterionKind::Tool {
            name,
            params,
            count,
            loose,
        } => {
            let seen = ToolCalls::of(turns, spans);
            let calls: Vec<&ToolCallRecord> = seen.records();
            let named: Vec<&&ToolCallRecord> = calls.iter().filter(|c| &c.name == name).collect();
            let matching = named
                .iter()
                .filter(|c| arguments_match(&c.arguments, params, rendered, *loose))
                .count();
            if let Some(why) = seen.unknown().filter(|_| count.is_some() || matching == 0) {
                return skip(why);
            }
            let (status, detail) = match count {
                Some(n) if matching as u64 != u64::from(*n) => fail(format!(
                    "expected {n} matching call(s) to `{name}`, found {matching}"
                )),
                Some(_) => pass(format!("{matching} matching call(s) to `{name}`")),
                None if matching > 0 => pass(format!("`{name}` called ({matching}x)")),
                None if named.is_empty() => {
                    fail(format!("no call to `{name}`{}", describe_calls(&calls)))
                }
                None => fail(format!(
                    "`{name}` was called, but not with {}; arguments seen: {}{}{}",
                    describe_params(params, rendered),
                    named
                        .iter()
                        .map(|c| c.arguments.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    type_hint(params, rendered, &named),
                    unreadable_arguments(&named)
                )),
            };
            seen.mark(status, detail)
        }
        CriterionKind::NoTool { name: Some(name) } => {
            let seen = ToolCalls::of(turns, spans);
            let n = seen.records().iter().filter(|c| &c.name == name).count();
            if let Some(why) = seen.unknown().filter(|_| n == 0) {
                return skip(why);
            }
            let (status, detail) = if n == 0 {
                pass(format!("`{name}` not called"))
            } else {
                fail(format!("`{name}` was called {n} time(s)"))
            };
            seen.mark(status, detail)
        }
        CriterionKind::NoTool { name: None } => {
            let seen = ToolCalls::of(turns, spans);
            let called: Vec<&str> = seen.records().iter().map(|c| c.name.as_str()).collect();
            if let Some(why) = seen.unknown().filter(|_| called.is_empty()) {
                return skip(why);
            }
            let (status, detail) = if called.is_empty() {
                pass("no tool called".to_owned())
            } else {
                fail(format!(
                    "no tool may be called, but {} call(s) were made: {}",
                    called.len(),
                    called.join(", ")
                ))
            };
            seen.mark(status, detail)
        }
        CriterionKind::ToolsInOrder(expected) => {
            let seen = ToolCalls::of(turns, spans);
            let records = seen.records();
            let calls: Vec<&str> = records.iter().map(|c| c.name.as_str()).collect();
            // A call counts as after the one matched before it only if it did not run in
            // parallel with it (calls from spans that overlapped in time).
            let mut next = 0;
            let mut last_group = None;
            for (i, name) in calls.iter().enumerate() {
                let group = seen.group(i);
                if next < expected.len()
                    && *name == expected[next]
                    && (group.is_none() || group != last_group)
                {
                    next += 1;
                    last_group = group;
                }
            }
            if let Some(why) = seen.unknown().filter(|_| next < expected.len()) {
                return skip(why);
            }
            let (status, detail) = if next == expected.len() {
                pass(format!("calls in order: {}", seen.describe()))
            } else {
                fail(format!(
                    "expected `{}` after {}; calls were: {}",
                    expected[next],
                    if next == 0 {
                        "the start".to_string()
                    } else {
                        format!("`{}`", expected[next - 1])
                    },
                    if calls.is_empty() {
                        "none".to_string()
                    } else {
                        seen.describe()
                    }
                ))
            };
            seen.mark(status, detail)
        }
        CriterionKind::Latency { max } => {
            let limit = ms(*max);
            match turns
                .iter()
                .filter(|t| t.fault.is_none())
                .find(|t| t.latency_ms > limit)
            {
                Some(t) => fail(format!(
                    "turn {} took {} > {}",
                    t.turn_index,
                    fmt_ms(t.latency_ms),
                    fmt_ms(limit)
                )),
                None => {
                    let worst = turns.iter().map(|t| t.latency_ms).fold(0.0, f64::max);
                    pass(format!("slowest turn {}", fmt_ms(worst)))
                }
            }
        }
        CriterionKind::Ttft { max } => {
            let limit = ms(*max);
            let measured: Vec<(u32, f64)> = turns
                .iter()
                .filter_map(|t| t.ttft_ms.map(|v| (t.turn_index, v)))
                .collect();
            if measured.is_empty() {
                return skip("no first-token time: the protocol did not stream this turn");
            }
            match measured.iter().find(|(_, v)| *v > limit) {
                Some((i, v)) => fail(format!(
                    "turn {i}: first token after {} > {}",
                    fmt_ms(*v),
                    fmt_ms(limit)
                )),
                None => {
                    let worst = measured.iter().map(|(_, v)| *v).fold(0.0, f64::max);
                    pass(format!("slowest first token {}", fmt_ms(worst)))
                }
            }
        }
        CriterionKind::Turns { max } => {
            let n = all.len();
            if n as u64 <= u64::from(*max) {
                pass(format!("{n} turn(s)"))
            } else {
                fail(format!(
                    "{} > {max}",
                    if n == 1 {
                        "1 turn".to_owned()
                    } else {
                        format!("{n} turns")
                    }
                ))
            }
        }
        CriterionKind::Tokens { max } => {
            // Turns that sent a request, whose tokens were spent whether reported or not.
            let sent: Vec<&TurnRecord> = turns
                .iter()
                .copied()
                .filter(|t| t.attempts > 0 || turn_tokens(t).is_some())
                .collect();
            let reported: Vec<u64> = sent.iter().filter_map(|t| turn_tokens(t)).collect();
            if reported.is_empty() {
                return skip("the agent reported no token usage");
            }
            let total = reported.iter().fold(0u64, |sum, &t| sum.saturating_add(t));
            let unreported = sent.len() - reported.len();
            let partial = sent.iter().filter(|t| t.tokens_partial).count();
            if total > *max {
                fail(format!("{total} tokens > {max}"))
            } else if unreported > 0 || partial > 0 {
                // Under the bar on what was reported; what was not may be over it.
                let what = if unreported > 0 {
                    format!("{unreported} of {} turns reported no usage", sent.len())
                } else if sent.len() == 1 {
                    "the turn's usage was reported only in part".to_owned()
                } else {
                    format!("{partial} turn(s) reported their usage only in part")
                };
                skip(format!(
                    "at least {total} tokens, but {what}: the total is not known"
                ))
            } else {
                pass(format!("{total} tokens"))
            }
        }
        CriterionKind::NoError => {
            // No agent call, nothing that could fault: not a pass (a recorded conversation
            // that ends with the agent's answer runs no turn).
            if turns.is_empty() {
                return skip("no turn was taken: the agent was never called");
            }
            if let Some((t, f)) = turns.iter().find_map(|t| t.fault.as_ref().map(|f| (t, f))) {
                return fail(format!(
                    "turn {}: {} fault: {}",
                    t.turn_index,
                    f.category.as_str(),
                    f.message
                ));
            }
            match turns.iter().find_map(|t| {
                t.tool_calls
                    .iter()
                    .find(|c| c.result.as_deref().is_some_and(is_violation_result))
                    .map(|c| (t, c))
            }) {
                Some((t, c)) => fail(format!(
                    "turn {}: `{}` breached a policy: {}",
                    t.turn_index,
                    c.name,
                    c.result.as_deref().unwrap_or_default()
                )),
                None => pass("no fault"),
            }
        }
        CriterionKind::Judge { .. } | CriterionKind::Outcome(_) => skip("no judge configured"),
        CriterionKind::State { path, check } => {
            let Some(sandbox) = sandbox else {
                return skip(NO_SANDBOX);
            };
            let actual = sandbox.state_at(path);
            let expectation = state_expectation(check);
            let seen = match actual {
                Some(value) => {
                    let text = value.to_string();
                    match text.char_indices().nth(160) {
                        Some((cut, _)) => format!("`{path}` is {}…", &text[..cut]),
                        None => format!("`{path}` is {text}"),
                    }
                }
                None => format!("`{path}` is not in the state"),
            };
            if expectation.holds(actual) {
                pass(seen)
            } else {
                fail(format!("{seen}; expected {}", describe_state_check(check)))
            }
        }
        CriterionKind::Violations { max } => {
            if sandbox.is_none() {
                return skip(NO_SANDBOX);
            }
            let breaches: Vec<&ToolCallRecord> = turns
                .iter()
                .flat_map(|t| &t.tool_calls)
                .filter(|c| c.result.as_deref().is_some_and(is_violation_result))
                .collect();
            let n = breaches.len();
            let listed = breaches
                .iter()
                .map(|c| format!("`{}` {}", c.name, c.arguments))
                .collect::<Vec<_>>()
                .join(", ");
            if n as u64 <= u64::from(*max) {
                pass(if n == 0 {
                    "no policy violation".to_string()
                } else {
                    format!("{n} policy violation{}: {listed}", plural(n))
                })
            } else {
                fail(format!(
                    "{n} policy violation{} > {max}: {listed}",
                    plural(n)
                ))
            }
        }
        CriterionKind::Span {
            name,
            attributes,
            count,
        } => {
            let spans = match spans_of(turns) {
                Ok(spans) => spans,
                Err(why) => return skip(why),
            };
            let named: Vec<&SpanRecord> =
                spans.iter().filter(|s| &s.name == name).copied().collect();
            let matching = named
                .iter()
                .filter(|s| {
                    attributes.iter().all(|(key, want)| {
                        s.attributes.get(key).is_some_and(|got| {
                            written_matches(got, want, TextCase::Exact, Written::Literal)
                        })
                    })
                })
                .count();
            match count {
                Some(n) if matching as u64 != u64::from(*n) => fail(format!(
                    "expected {n} span(s) `{name}` with those attributes, found {matching}"
                )),
                Some(_) => pass(format!("{matching} span(s) `{name}`")),
                None if matching > 0 => pass(format!("span `{name}` ({matching}x)")),
                None if named.is_empty() => fail(format!(
                    "no span `{name}`; the agent's spans were: {}",
                    span_names(&spans)
                )),
                None => fail(format!(
                    "span `{name}` was reported, but not with {}; attributes seen: {}",
                    serde_json::Value::Object(attributes.clone()),
                    named
                        .iter()
                        .map(|s| serde_json::Value::Object(s.attributes.clone()).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
        CriterionKind::SpanCount { name, min, max } => {
            let spans = match spans_of(turns) {
                Ok(spans) => spans,
                Err(why) => return skip(why),
            };
            let n = spans.iter().filter(|s| &s.name == name).count() as u64;
            let low = min.is_some_and(|m| n < u64::from(m));
            let high = max.is_some_and(|m| n > u64::from(m));
            let bounds = match (min, max) {
                (Some(a), Some(b)) => format!("{a}–{b}"),
                (Some(a), None) => format!("at least {a}"),
                (None, Some(b)) => format!("at most {b}"),
                (None, None) => "any number".to_owned(),
            };
            if low || high {
                fail(format!("{n} span(s) `{name}`, expected {bounds}"))
            } else {
                pass(format!("{n} span(s) `{name}`"))
            }
        }
        CriterionKind::SpansInOrder(expected) => {
            let spans = match spans_of(turns) {
                Ok(spans) => spans,
                Err(why) => return skip(why),
            };
            // Each expected span must start after the previous match ended: spans that
            // overlap ran in parallel, which is not an order.
            let mut next = 0;
            let mut after = 0u64;
            for span in &spans {
                if next < expected.len()
                    && span.name == expected[next]
                    && (next == 0 || span.start_unix_nano >= after)
                {
                    next += 1;
                    after = span.end_unix_nano;
                }
            }
            if next == expected.len() {
                pass(format!("spans in order: {}", expected.join(", ")))
            } else {
                fail(format!(
                    "no span `{}` starting after {} ended; the agent's spans were: {}",
                    expected[next],
                    if next == 0 {
                        "the start".to_string()
                    } else {
                        format!("`{}`", expected[next - 1])
                    },
                    span_names(&spans)
                ))
            }
        }
        CriterionKind::SpanDuration { name, max } => {
            let spans = match spans_of(turns) {
                Ok(spans) => spans,
                Err(why) => return skip(why),
            };
            let limit = ms(*max);
            let named: Vec<&&SpanRecord> = spans.iter().filter(|s| &s.name == name).collect();
            if named.is_empty() {
                return fail(format!(
                    "no span `{name}`; the agent's spans were: {}",
                    span_names(&spans)
                ));
            }
            match named.iter().find(|s| s.duration_ms() > limit) {
                Some(s) => fail(format!(
                    "span `{name}` took {} > {}",
                    fmt_ms(s.duration_ms()),
                    fmt_ms(limit)
                )),
                None => {
                    let worst = named.iter().map(|s| s.duration_ms()).fold(0.0, f64::max);
                    pass(format!("slowest `{name}` {}", fmt_ms(worst)))
                }
            }
        }
    }
}

/// Why a span check is skipped: no turn it looks at has any span.
const NO_SPANS: &str = "no spans were collected for this turn: the agent needs `spans #true`, \
     and its OTEL_EXPORTER_OTLP_ENDPOINT set to the run's receiver (printed at the start; \
     --otlp-receiver ADDR fixes its address), exporting OTLP/HTTP the receiver takes (the \
     console names why it refused an export, if it did)";

/// What a turn without spans needs, for the tool checks of an agent with `spans #true`.
const NO_SPANS_HINT: &str = "its OTEL_EXPORTER_OTLP_ENDPOINT must be set to the run's \
     receiver (printed at the start; --otlp-receiver ADDR fixes its address), exporting \
     OTLP/HTTP the receiver takes (the console names why it refused an export, if it did)";

/// The agent's spans on `turns`, in start order; why not, when some turn has none. An
/// instrumented agent reports at least its root span per turn, so a turn without any was
/// not collected (its export failed, or arrived after the wait): counting, ordering or
/// timing the spans of the others would decide on part of the trajectory.
fn spans_of<'a>(turns: &[&'a TurnRecord]) -> Result<Vec<&'a SpanRecord>, String> {
    let missing: Vec<String> = turns
        .iter()
        .filter(|t| t.spans.is_empty())
        .map(|t| t.turn_index.to_string())
        .collect();
    if missing.len() == turns.len() {
        return Err(NO_SPANS.to_owned());
    }
    if !missing.is_empty() {
        return Err(format!(
            "no spans were collected for turn {} of the {} this check reads, so it would \
             decide on part of them; {NO_SPANS_HINT}",
            missing.join(", "),
            turns.len()
        ));
    }
    let mut spans: Vec<&SpanRecord> = turns.iter().flat_map(|t| &t.spans).collect();
    spans.sort_by_key(|s| (s.start_unix_nano, s.end_unix_nano));
    Ok(spans)
}

fn span_names(spans: &[&SpanRecord]) -> String {
    spans
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tool calls the tool criteria look at: each turn's calls on the wire, or, for a turn
/// whose wire shows none, those in the agent's GenAI `execute_tool` (or OpenInference
/// `TOOL`) spans, with which of them ran in parallel.
struct ToolCalls<'a> {
    calls: Vec<std::borrow::Cow<'a, ToolCallRecord>>,
    /// Per call: `(turn, group)` for calls from spans (one group: ran in parallel).
    groups: Vec<Option<(usize, u32)>>,
    from_spans: bool,
    /// Turns whose calls are unknown: the agent's calls are read from its spans, and the
    /// turn has neither calls in its answer nor spans.
    unknown: Vec<u32>,
}

impl<'a> ToolCalls<'a> {
    fn of(turns: &[&'a TurnRecord], tools_from_spans: bool) -> Self {
        let mut out = ToolCalls {
            calls: Vec::new(),
            groups: Vec::new(),
            from_spans: false,
            unknown: Vec::new(),
        };
        for (t, turn) in turns.iter().enumerate() {
            if tools_from_spans && turn.tool_calls.is_empty() && turn.spans.is_empty() {
                out.unknown.push(turn.turn_index);
            }
            if !turn.tool_calls.is_empty() || turn.spans.is_empty() {
                for call in &turn.tool_calls {
                    out.calls.push(std::borrow::Cow::Borrowed(call));
                    out.groups.push(None);
                }
                continue;
            }
            for call in crate::otel::tools::tool_calls(&turn.spans) {
                out.from_spans = true;
                out.groups.push(Some((t, call.group)));
                out.calls.push(std::borrow::Cow::Owned(ToolCallRecord {
                    call_id: call.call_id.unwrap_or_default(),
                    name: call.name,
                    arguments: call.arguments.unwrap_or_else(|| "{}".to_owned()),
                    result: call.result,
                }));
            }
        }
        out
    }

    /// Why the calls are not known on every turn the check looks at, if they are not.
    fn unknown(&self) -> Option<String> {
        let turns: Vec<String> = self.unknown.iter().map(u32::to_string).collect();
        (!turns.is_empty()).then(|| {
            format!(
                "the agent's tool calls are read from its spans, and no spans were collected \
                 for turn{} {}: {}",
                plural(turns.len()),
                turns.join(", "),
                NO_SPANS_HINT
            )
        })
    }

    fn records(&self) -> Vec<&ToolCallRecord> {
        self.calls.iter().map(AsRef::as_ref).collect()
    }

    fn group(&self, i: usize) -> Option<(usize, u32)> {
        self.groups.get(i).copied().flatten()
    }

    /// The calls, those that ran in parallel bracketed: `a, [b ‖ c], d`.
    fn describe(&self) -> String {
        let mut out = String::new();
        let mut i = 0;
        while i < self.calls.len() {
            let group = self.group(i);
            let mut j = i + 1;
            while group.is_some() && j < self.calls.len() && self.group(j) == group {
                j += 1;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            let names: Vec<&str> = self.calls[i..j].iter().map(|c| c.name.as_str()).collect();
            if names.len() > 1 {
                out.push('[');
                out.push_str(&names.join(" ‖ "));
                out.push(']');
            } else {
                out.push_str(names.join("").as_str());
            }
            i = j;
        }
        out
    }

    /// A verdict on these calls, saying so when they were read from the agent's spans.
    fn mark(
        &self,
        status: CriterionStatus,
        detail: Option<String>,
    ) -> (CriterionStatus, Option<String>) {
        if self.from_spans {
            (
                status,
                detail.map(|d| format!("{d} (tool calls from the agent's spans)")),
            )
        } else {
            (status, detail)
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn state_expectation(check: &trellis_dsl::StateCheck) -> StateExpectation {
    use trellis_dsl::StateCheck;
    match check {
        StateCheck::Equals(v) => StateExpectation::Equals(v.clone()),
        StateCheck::Contains(v) => StateExpectation::Contains(v.clone()),
        StateCheck::Matches(re) => StateExpectation::Regex(re.regex().clone()),
        StateCheck::Near { value, tolerance } => StateExpectation::Near {
            value: *value,
            tolerance: *tolerance,
        },
        StateCheck::Exists => StateExpectation::Exists,
        StateCheck::Absent => StateExpectation::Absent,
    }
}

fn describe_state_check(check: &trellis_dsl::StateCheck) -> String {
    use trellis_dsl::StateCheck;
    match check {
        StateCheck::Equals(v) => format!("equal to {v}"),
        StateCheck::Contains(v) => format!("containing {v}"),
        StateCheck::Matches(re) => format!("matching /{}/", re.as_str()),
        StateCheck::Near { value, tolerance } => format!("{value} ± {tolerance}"),
        StateCheck::Exists => "to exist".to_string(),
        StateCheck::Absent => "to be absent".to_string(),
    }
}

fn turn_tokens(t: &TurnRecord) -> Option<u64> {
    t.total_tokens
        .or(match (t.prompt_tokens, t.completion_tokens) {
            (None, None) => None,
            (p, c) => Some(p.unwrap_or(0).saturating_add(c.unwrap_or(0))),
        })
}

/// Returns why the check failed, or `None` when it holds. `rendered` replaces the check's
/// value when it was written as a template.
fn reply_check(
    check: &ReplyCheck,
    rendered: Option<&str>,
    scope: Scope,
    turns: &[&TurnRecord],
) -> Option<String> {
    let replies: Vec<&str> = turns
        .iter()
        .map(|t| t.reply.as_deref().unwrap_or(""))
        .collect();
    let last = replies.last().copied().unwrap_or("");
    let any = |f: &dyn Fn(&str) -> bool| match scope {
        Scope::Turn => f(last),
        Scope::Trajectory => replies.iter().any(|r| f(r)),
    };
    let seen = || match scope {
        Scope::Turn if turns.last().is_some_and(|t| t.reply.is_none()) => {
            "the turn has no reply".to_string()
        }
        Scope::Turn => format!("reply was: {}", excerpt(last, 160)),
        Scope::Trajectory => format!("no reply of {} turn(s) does", turns.len()),
    };
    let value = |written: &'_ str| -> String { rendered.unwrap_or(written).to_string() };
    match check {
        ReplyCheck::JsonPath {
            path,
            source,
            equals,
        } => {
            let rendered = rendered.map(|text| Value::String(text.to_string()));
            let equals = match &rendered {
                Some(text) => Some((text, Written::Rendered)),
                None => equals.as_ref().map(|v| (v, Written::Literal)),
            };
            let mut why = String::from("no turn");
            for turn in turns.iter().rev() {
                match json_path_check(turn, path, source, equals) {
                    Ok(()) => return None,
                    Err(e) => why = e,
                }
                if scope == Scope::Turn {
                    break;
                }
            }
            Some(match scope {
                Scope::Turn => why,
                Scope::Trajectory => format!("no turn of {} holds; last: {why}", turns.len()),
            })
        }
        ReplyCheck::Contains(_) | ReplyCheck::Matches(_) | ReplyCheck::Equals(_)
            if any(&|r: &str| holds(check, rendered, r) == Some(true)) =>
        {
            None
        }
        ReplyCheck::Contains(needle) => Some(format!(
            "expected the reply to contain {}; {}",
            quoted(&value(needle)),
            seen()
        )),
        ReplyCheck::Matches(re) => Some(format!(
            "expected the reply to match /{}/; {}",
            re.as_str(),
            seen()
        )),
        ReplyCheck::Equals(expected) => Some(format!(
            "expected the reply to equal {}; {}",
            quoted(&value(expected)),
            seen()
        )),
        ReplyCheck::NotContains(needle) => {
            let needle = value(needle);
            let composed = crate::sandbox::nfc(&needle);
            replies
                .iter()
                .zip(turns)
                .find(|(r, _)| crate::sandbox::nfc(r).contains(composed.as_ref()))
                .map(|(r, t)| {
                    format!(
                        "turn {} reply contains {}: {}",
                        t.turn_index,
                        quoted(&needle),
                        excerpt(r, 160)
                    )
                })
        }
    }
}

/// Whether `reply` holds a check that a reply can hold by itself (`contains`, `matches`,
/// `equals`, with its rendered `value`); `None` for the others.
///
/// Text is compared in Unicode NFC ([`crate::sandbox::nfc`]): a reply that reads the same
/// as the check holds it, whichever way its accents were composed.
fn holds(check: &ReplyCheck, value: Option<&str>, reply: &str) -> Option<bool> {
    let reply = crate::sandbox::nfc(reply);
    let reply = reply.as_ref();
    match check {
        ReplyCheck::Contains(needle) => {
            Some(reply.contains(crate::sandbox::nfc(value.unwrap_or(needle)).as_ref()))
        }
        ReplyCheck::Matches(re) => Some(re.is_match(reply)),
        ReplyCheck::Equals(expected) => {
            Some(reply == crate::sandbox::nfc(value.unwrap_or(expected)).as_ref())
        }
        ReplyCheck::NotContains(_) | ReplyCheck::JsonPath { .. } => None,
    }
}

/// `reply json-path=…` on one turn (see [`json_path_node`]).
fn json_path_check(
    turn: &TurnRecord,
    path: &serde_json_path::JsonPath,
    source: &str,
    equals: Option<(&Value, Written)>,
) -> Result<(), String> {
    let found = json_path_node(
        turn.data.as_ref(),
        turn.reply.as_deref().unwrap_or(""),
        path,
        source,
    )?;
    match equals {
        None => Ok(()),
        Some((expected, how)) if written_matches(&found, expected, TextCase::Exact, how) => Ok(()),
        Some((expected, _)) => Err(format!(
            "json-path {source} is {}, expected {expected}",
            found.to_string().chars().take(160).collect::<String>()
        )),
    }
}

/// The first node a JSON path (`reply json-path=…`, `capture … json-path=…`) selects in a
/// turn: in its structured data (an A2A task, an `http` agent's answer body), else, when
/// the path selects nothing there or the turn has none, in its reply parsed as JSON (an
/// agent whose reply text is itself JSON). The error says what was looked at.
pub fn json_path_node(
    data: Option<&Value>,
    reply: &str,
    path: &serde_json_path::JsonPath,
    source: &str,
) -> Result<Value, String> {
    if let Some(found) = data.and_then(|data| path.query(data).first()) {
        return Ok(found.clone());
    }
    let Ok(parsed) = serde_json::from_str::<Value>(reply) else {
        return Err(match data {
            Some(_) => format!(
                "json-path {source} selects nothing in the turn's structured data, and its \
                 reply is not JSON"
            ),
            None => format!(
                "json-path {source}: the turn has no structured data and its reply is not \
                 JSON: {}",
                excerpt(reply, 160)
            ),
        });
    };
    path.query(&parsed)
        .first()
        .cloned()
        .ok_or_else(|| match data {
            Some(_) => format!(
                "json-path {source} selects nothing in the turn's structured data or its reply"
            ),
            None => format!("json-path {source} selects nothing"),
        })
}

/// `; the arguments of … are not a JSON object (…)`, when a call's arguments could not be
/// read, so no parameter of it can match: one value JSON numbers cannot hold (`1e400`) made
/// every parameter check fail with only "not with f=0.1" to say why.
fn unreadable_arguments(calls: &[&&ToolCallRecord]) -> String {
    calls
        .iter()
        .find_map(|c| match serde_json::from_str::<Value>(&c.arguments) {
            Ok(Value::Object(_)) => None,
            Ok(other) => Some(format!(
                "; the arguments of a call are {}, not a JSON object",
                crate::transport::quote::kind_of(&other)
            )),
            Err(e) => Some(format!(
                "; the arguments of a call are not a JSON object Trellis can read ({e}), so \
                 none of its parameters can match"
            )),
        })
        .unwrap_or_default()
}

/// Subset match of expected params against a call's JSON arguments, each by
/// [`written_matches`] (a literal by JSON equality, a rendered template as text). `loose`
/// (expect-tool):
/// strings compare case-insensitively and an expected `null` matches anything, absent
/// included.
fn arguments_match(
    arguments: &str,
    expected: &serde_json::Map<String, Value>,
    rendered: &Rendered,
    loose: bool,
) -> bool {
    if expected.is_empty() {
        return true;
    }
    let Ok(Value::Object(actual)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    let case = if loose {
        TextCase::Insensitive
    } else {
        TextCase::Exact
    };
    expected.iter().all(|(k, v)| {
        let rendered = rendered
            .tool_param(k)
            .map(|text| Value::String(text.to_string()));
        let (written, how) = match &rendered {
            Some(text) => (text, Written::Rendered),
            None => (v, Written::Literal),
        };
        if loose && written.is_null() {
            return true;
        }
        actual
            .get(k)
            .is_some_and(|a| written_matches(a, written, case, how))
    })
}

/// When a literal string parameter fails only because the agent sent the number or boolean
/// it spells (`passengers="2"` against `2`), says how to write the value it sent: literals
/// compare by JSON equality, which a reader easily misses.
fn type_hint(
    params: &serde_json::Map<String, Value>,
    rendered: &Rendered,
    calls: &[&&ToolCallRecord],
) -> String {
    for call in calls {
        let Ok(Value::Object(args)) = serde_json::from_str::<Value>(&call.arguments) else {
            continue;
        };
        for (key, written) in params {
            let (Value::String(text), None) = (written, rendered.tool_param(key)) else {
                continue;
            };
            let Some(sent) = args.get(key).filter(|a| a.is_number() || a.is_boolean()) else {
                continue;
            };
            if written_matches(sent, written, TextCase::Exact, Written::Rendered) {
                let kind = if sent.is_number() {
                    "number"
                } else {
                    "boolean"
                };
                return format!(
                    " (`{key}` was the {kind} {sent}, and {key}=\"{text}\" is a string: write \
                     {key}={})",
                    match sent {
                        Value::Bool(b) => format!("#{b}"),
                        other => other.to_string(),
                    }
                );
            }
        }
    }
    String::new()
}

fn describe_calls(calls: &[&ToolCallRecord]) -> String {
    if calls.is_empty() {
        "; no tools were called".to_string()
    } else {
        format!(
            "; calls were: {}",
            calls
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

fn describe_params(params: &serde_json::Map<String, Value>, rendered: &Rendered) -> String {
    params
        .iter()
        .map(|(k, v)| match rendered.tool_param(k) {
            Some(text) => format!("{k}={}", Value::String(text.to_string())),
            None => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2}s", v / 1000.0)
    } else {
        format!("{v:.1}ms")
    }
}

fn excerpt(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        quoted(s)
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{}…", quoted(&cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_dsl::{Span, model::Criterion};

    fn crit(kind: CriterionKind) -> Criterion {
        Criterion {
            kind,
            text: "test".into(),
            templates: Vec::new(),
            span: Span::new(0, (0, 0).into()),
        }
    }

    fn turn(i: u32, reply: &str, calls: &[(&str, &str)]) -> TurnRecord {
        TurnRecord {
            turn_index: i,
            reply: Some(reply.into()),
            latency_ms: 10.0 * f64::from(i + 1),
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(n, (name, args))| ToolCallRecord {
                    call_id: format!("c{n}"),
                    name: (*name).into(),
                    arguments: (*args).into(),
                    result: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_detail_quoting_a_huge_argument_is_bounded() {
        let args = format!(r#"{{"note": "{}"}}"#, "é".repeat(200_000));
        let turns = [turn(0, "ok", &[("pay", &args)])];
        let mut params = serde_json::Map::new();
        params.insert("note".into(), serde_json::json!("x"));
        let c = crit(CriterionKind::Tool {
            name: "pay".into(),
            params,
            count: None,
            loose: false,
        });
        let r = check(&c, Scope::Turn, &turns, Some(0));
        assert_eq!(r.status, CriterionStatus::Failed);
        let detail = r.detail.unwrap();
        assert!(detail.chars().count() < 2_100, "{}", detail.len());
        assert!(
            detail.ends_with("more characters)"),
            "{}",
            &detail[detail.len() - 40..]
        );
    }

    /// A turn whose spans were not collected leaves a span check undecided: on the others
    /// alone, `span-count max=1` would pass and `min=2` fail on part of the trajectory.
    #[test]
    fn span_checks_over_a_turn_without_spans_are_skipped() {
        let span = |name: &str, start: u64| SpanRecord {
            name: name.into(),
            start_unix_nano: start,
            end_unix_nano: start + 10,
            ..Default::default()
        };
        let mut turns = [turn(0, "a", &[]), turn(1, "b", &[])];
        turns[0].spans = vec![span("invoke_agent", 0), span("execute_tool lookup", 1)];
        let count = |min, max| {
            crit(CriterionKind::SpanCount {
                name: "execute_tool lookup".into(),
                min,
                max,
            })
        };
        for c in [count(None, Some(1)), count(Some(2), None)] {
            let r = check(&c, Scope::Trajectory, &turns, None);
            assert_eq!(r.status, CriterionStatus::Skipped, "{r:?}");
            assert!(
                r.detail
                    .as_deref()
                    .unwrap_or_default()
                    .contains("turn 1 of the 2"),
                "{r:?}"
            );
        }
        turns[1].spans = vec![span("invoke_agent", 20), span("execute_tool lookup", 21)];
        let r = check(&count(Some(2), Some(2)), Scope::Trajectory, &turns, None);
        assert_eq!(r.status, CriterionStatus::Passed, "{r:?}");
    }

    #[test]
    fn tool_params_are_a_subset_with_numeric_equality() {
        let turns = [turn(
            0,
            "ok",
            &[("pay", r#"{"amount": 50.0, "currency": "CAD"}"#)],
        )];
        let mut params = serde_json::Map::new();
        params.insert("amount".into(), serde_json::json!(50));
        let c = crit(CriterionKind::Tool {
            name: "pay".into(),
            params: params.clone(),
            count: None,
            loose: false,
        });
        assert_eq!(
            check(&c, Scope::Turn, &turns, Some(0)).status,
            CriterionStatus::Passed
        );
        params.insert("amount".into(), serde_json::json!(51));
        let c = crit(CriterionKind::Tool {
            name: "pay".into(),
            params,
            count: None,
            loose: false,
        });
        let r = check(&c, Scope::Turn, &turns, Some(0));
        assert_eq!(r.status, CriterionStatus::Failed);
        assert!(r.detail.unwrap().contains("not with amount=51"));
    }

    /// Arguments holding a number JSON cannot read (`1e400`) match no parameter, and the
    /// detail says why instead of only "not with f=0.1".
    #[test]
    fn unreadable_arguments_are_named_in_the_failure() {
        let turns = [turn(0, "ok", &[("t", r#"{"n": 1e400, "f": 0.1}"#)])];
        let mut params = serde_json::Map::new();
        params.insert("f".into(), serde_json::json!(0.1));
        let c = crit(CriterionKind::Tool {
            name: "t".into(),
            params,
            count: None,
            loose: false,
        });
        let r = check(&c, Scope::Turn, &turns, Some(0));
        assert_eq!(r.status, CriterionStatus::Failed);
        let detail = r.detail.unwrap_or_default();
        assert!(
            detail.contains("not a JSON object Trellis can read"),
            "{detail}"
        );
        assert!(detail.contains("out of range"), "{detail}");
    }

    #[test]
    fn expect_tool_matches_strings_case_insensitively_and_null_as_anything() {
        let turns = [turn(
            0,
            "ok",
            &[("book", r#"{"day": "Tuesday", "zone": "v4t0a7", "n": 2}"#)],
        )];
        let params: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"day": "TUESDAY", "zone": "V4T0A7", "note": null}"#).unwrap();
        let check = |loose| {
            check(
                &crit(CriterionKind::Tool {
                    name: "book".into(),
                    params: params.clone(),
                    count: None,
                    loose,
                }),
                Scope::Trajectory,
                &turns,
                None,
            )
            .status
        };
        assert_eq!(check(true), CriterionStatus::Passed);
        assert_eq!(check(false), CriterionStatus::Failed, "`tool` stays exact");
    }

    #[test]
    fn a_json_path_reads_the_structured_data_then_a_reply_that_is_json() {
        let path = |source: &str| serde_json_path::JsonPath::parse(source).unwrap();
        let data = serde_json::json!({"output": {"id": "call_1"}});
        let node = |data: Option<&Value>, reply: &str, source: &str| {
            json_path_node(data, reply, &path(source), source)
        };
        assert_eq!(
            node(Some(&data), r#"{"a": 1}"#, "$.output.id"),
            Ok(Value::from("call_1"))
        );
        assert_eq!(
            node(Some(&data), r#"{"a": 1}"#, "$.a"),
            Ok(Value::from(1)),
            "a path found only in a reply that is JSON"
        );
        let missing = node(Some(&data), "text", "$.a").unwrap_err();
        assert!(
            missing.contains("structured data, and its reply is not JSON"),
            "{missing}"
        );
        let missing = node(Some(&data), "{}", "$.a").unwrap_err();
        assert!(
            missing.contains("structured data or its reply"),
            "{missing}"
        );
        assert_eq!(node(None, r#"{"a": [2]}"#, "$.a[0]"), Ok(Value::from(2)));
    }

    #[test]
    fn reply_scopes_differ_between_turn_and_trajectory() {
        let turns = [turn(0, "hello postal code", &[]), turn(1, "bye", &[])];
        let c = crit(CriterionKind::Reply(vec![ReplyCheck::Contains(
            "postal".into(),
        )]));
        assert_eq!(
            check(&c, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Passed
        );
        assert_eq!(
            check(&c, Scope::Turn, &turns[1..], Some(1)).status,
            CriterionStatus::Failed
        );
        let c = crit(CriterionKind::Reply(vec![ReplyCheck::NotContains(
            "postal".into(),
        )]));
        assert_eq!(
            check(&c, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Failed
        );
    }

    /// A reply that reads the same as the check holds it, whichever way its accents are
    /// composed: `Montréal` precomposed in the suite, with a combining accent in the reply
    /// (and the other way round).
    #[test]
    fn text_is_compared_as_it_reads_whatever_its_composition() {
        let composed = "Montr\u{e9}al";
        let decomposed = "Montre\u{301}al";
        for (written, said) in [(composed, decomposed), (decomposed, composed)] {
            let turns = [turn(0, &format!("Booked in {said}."), &[])];
            for check_of in [
                ReplyCheck::Contains(written.into()),
                ReplyCheck::Equals(format!("Booked in {written}.")),
            ] {
                let c = crit(CriterionKind::Reply(vec![check_of]));
                assert_eq!(
                    check(&c, Scope::Turn, &turns, Some(0)).status,
                    CriterionStatus::Passed,
                    "{written:?} in {said:?}"
                );
            }
            let c = crit(CriterionKind::Reply(vec![ReplyCheck::NotContains(
                written.into(),
            )]));
            assert_eq!(
                check(&c, Scope::Turn, &turns, Some(0)).status,
                CriterionStatus::Failed
            );
        }
        assert!(crate::sandbox::written_matches(
            &Value::String(decomposed.into()),
            &Value::String(composed.into()),
            crate::sandbox::TextCase::Exact,
            crate::sandbox::Written::Literal
        ));
    }

    #[test]
    fn a_passing_trajectory_reply_check_quotes_the_turn_that_holds_it() {
        let turns = [turn(0, "hello postal code", &[]), turn(1, "bye", &[])];
        let c = crit(CriterionKind::Reply(vec![ReplyCheck::Contains(
            "postal".into(),
        )]));
        let record = check(&c, Scope::Trajectory, &turns, None);
        assert_eq!(record.status, CriterionStatus::Passed);
        assert_eq!(
            record.detail.as_deref(),
            Some("turn 0 reply: \"hello postal code\"")
        );
    }

    #[test]
    fn a_failure_quotes_text_in_any_script_as_written() {
        let reply = "नमस्ते 👨\u{200d}👩\u{200d}👧";
        let turns = [turn(0, reply, &[])];
        let c = crit(CriterionKind::Reply(vec![ReplyCheck::Contains(
            "café Z\u{337}".into(),
        )]));
        let record = check(&c, Scope::Turn, &turns, Some(0));
        assert_eq!(record.status, CriterionStatus::Failed);
        assert_eq!(
            record.detail.as_deref(),
            Some(
                "expected the reply to contain \"café Z\u{337}\"; \
                 reply was: \"नमस्ते 👨\u{200d}👩\u{200d}👧\""
            )
        );
    }

    #[test]
    fn a_text_to_look_for_that_rendered_empty_is_an_error_not_a_pass() {
        let turns = [turn(0, "anything at all", &[])];
        for check in [
            ReplyCheck::Contains("{{ row.expected }}".into()),
            ReplyCheck::NotContains("{{ row.expected }}".into()),
        ] {
            let rendered = Rendered {
                values: vec![(ValueSlot::ReplyCheck(0), String::new())],
            };
            for scope in [Scope::Turn, Scope::Trajectory] {
                let record = check_rendered(
                    &crit(CriterionKind::Reply(vec![check.clone()])),
                    &rendered,
                    scope,
                    &turns,
                    Some(0),
                    Evidence::default(),
                );
                assert_eq!(record.status, CriterionStatus::Error, "{check:?}");
                assert!(
                    record
                        .detail
                        .as_deref()
                        .unwrap_or("")
                        .contains("rendered empty"),
                    "{record:?}"
                );
            }
        }
    }

    #[test]
    fn tools_in_order_is_a_subsequence() {
        let turns = [turn(0, "", &[("a", "{}"), ("x", "{}"), ("b", "{}")])];
        let ok = crit(CriterionKind::ToolsInOrder(vec!["a".into(), "b".into()]));
        let bad = crit(CriterionKind::ToolsInOrder(vec!["b".into(), "a".into()]));
        assert_eq!(
            check(&ok, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Passed
        );
        assert_eq!(
            check(&bad, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Failed
        );
    }

    #[test]
    fn judges_are_skipped_never_passed() {
        let c = crit(CriterionKind::Outcome(trellis_dsl::Outcome::Statement(
            "x".into(),
        )));
        let r = check(&c, Scope::Trajectory, &[turn(0, "", &[])], None);
        assert_eq!(r.status, CriterionStatus::Skipped);
        assert_eq!(r.detail.as_deref(), Some("no judge configured"));
    }

    #[test]
    fn sandbox_checks_without_a_sandbox_are_skipped_with_the_reason_check_warns_about() {
        let kinds = [
            CriterionKind::State {
                path: "orders.0.status".into(),
                check: trellis_dsl::StateCheck::Exists,
            },
            CriterionKind::Violations { max: 0 },
        ];
        for kind in kinds {
            assert_eq!(crate::plan::not_runnable::criterion(&kind), None);
            let c = crit(kind);
            for scope in [Scope::Turn, Scope::Trajectory] {
                let r = check(&c, scope, &[turn(0, "", &[])], Some(0));
                assert_eq!(r.status, CriterionStatus::Skipped);
                assert_eq!(r.detail.as_deref(), Some(NO_SANDBOX));
            }
        }
    }

    #[test]
    fn turn_level_turns_counts_every_turn_so_far() {
        let turns = [turn(0, "", &[]), turn(1, "", &[]), turn(2, "", &[])];
        let c = crit(CriterionKind::Turns { max: 1 });
        assert_eq!(
            check(&c, Scope::Turn, &turns, Some(2)).status,
            CriterionStatus::Failed
        );
    }

    #[test]
    fn tokens_under_the_bar_with_usage_missing_are_not_a_pass() {
        let c = crit(CriterionKind::Tokens { max: 150 });
        let reported = |tokens: Option<u64>| {
            let mut t = turn(0, "", &[]);
            t.attempts = 1;
            t.total_tokens = tokens;
            t
        };
        // A turn of two requests, one of which reported nothing.
        let mut partial = reported(Some(107));
        partial.tokens_partial = true;
        let r = check(&c, Scope::Turn, std::slice::from_ref(&partial), Some(0));
        assert_eq!(r.status, CriterionStatus::Skipped, "{r:?}");
        let detail = r.detail.as_deref().unwrap_or("");
        assert!(
            detail.contains("at least 107") && detail.contains("reported only in part"),
            "{detail}"
        );
        // Two turns, the first without usage.
        let turns = [reported(None), reported(Some(107))];
        let r = check(&c, Scope::Trajectory, &turns, None);
        assert_eq!(r.status, CriterionStatus::Skipped, "{r:?}");
        assert!(
            r.detail.as_deref().unwrap_or("").contains("1 of 2 turns"),
            "{r:?}"
        );
        // Over the bar on what was reported: failed, whatever was not.
        let turns = [reported(None), reported(Some(151))];
        let r = check(&c, Scope::Trajectory, &turns, None);
        assert_eq!(r.status, CriterionStatus::Failed, "{r:?}");
        // Everything reported, under the bar: passed.
        let turns = [reported(Some(40)), reported(Some(107))];
        let r = check(&c, Scope::Trajectory, &turns, None);
        assert_eq!(r.status, CriterionStatus::Passed, "{r:?}");
    }

    #[test]
    fn token_sums_saturate_instead_of_wrapping() {
        let mut t = turn(0, "", &[]);
        t.prompt_tokens = Some(u64::MAX);
        t.completion_tokens = Some(1);
        let c = crit(CriterionKind::Tokens { max: 100 });
        assert_eq!(
            check(&c, Scope::Trajectory, &[t], None).status,
            CriterionStatus::Failed
        );
    }

    #[test]
    fn tool_checks_of_an_agent_whose_calls_are_in_its_spans_skip_turns_without_spans() {
        let spans = Evidence {
            sandbox: None,
            tools_from_spans: true,
        };
        let status = |kind: CriterionKind, turns: &[TurnRecord], evidence: Evidence<'_>| {
            let record = check_rendered(
                &crit(kind),
                &Rendered::default(),
                Scope::Trajectory,
                turns,
                None,
                evidence,
            );
            (record.status, record.detail.unwrap_or_default())
        };
        let tool = |name: &str| CriterionKind::Tool {
            name: name.into(),
            params: serde_json::Map::new(),
            count: None,
            loose: false,
        };
        let no_tool = || CriterionKind::NoTool {
            name: Some("get_weather".into()),
        };
        let in_order = || CriterionKind::ToolsInOrder(vec!["lookup".into(), "book".into()]);
        // No calls in the answer and no spans: nothing is known about the turn's calls.
        let silent = [turn(0, "ok", &[]), turn(1, "ok", &[])];
        for kind in [tool("get_weather"), no_tool(), in_order()] {
            let (status, detail) = status(kind, &silent, spans);
            assert_eq!(status, CriterionStatus::Skipped, "{detail}");
            assert!(
                detail.contains("no spans were collected for turns 0, 1"),
                "{detail}"
            );
        }
        // Without spans read, the same turns are evidence of no call.
        assert_eq!(
            status(no_tool(), &silent, Evidence::default()).0,
            CriterionStatus::Passed
        );
        // A call seen on one turn is evidence enough for `tool` and against `no-tool`.
        let one = [turn(0, "ok", &[("get_weather", "{}")]), turn(1, "ok", &[])];
        assert_eq!(
            status(tool("get_weather"), &one, spans).0,
            CriterionStatus::Passed
        );
        assert_eq!(status(no_tool(), &one, spans).0, CriterionStatus::Failed);
        // Calls in the answers of every turn: checked as usual.
        let both = [
            turn(0, "ok", &[("lookup", "{}")]),
            turn(1, "ok", &[("book", "{}")]),
        ];
        assert_eq!(status(in_order(), &both, spans).0, CriterionStatus::Passed);
        assert_eq!(
            status(tool("cancel"), &both, spans).0,
            CriterionStatus::Failed
        );
    }

    #[test]
    fn a_literal_string_that_spells_the_number_sent_says_how_to_write_it() {
        let turns = [turn(
            0,
            "ok",
            &[("book", r#"{"passengers": 2, "ok": true}"#)],
        )];
        let detail = |params: Value| {
            let Value::Object(params) = params else {
                panic!("params are an object")
            };
            let c = crit(CriterionKind::Tool {
                name: "book".into(),
                params,
                count: None,
                loose: false,
            });
            check(&c, Scope::Turn, &turns, Some(0))
                .detail
                .unwrap_or_default()
        };
        let d = detail(serde_json::json!({"passengers": "2"}));
        assert!(d.ends_with("write passengers=2)"), "{d}");
        let d = detail(serde_json::json!({"ok": "true"}));
        assert!(d.ends_with("write ok=#true)"), "{d}");
        let d = detail(serde_json::json!({"passengers": "3"}));
        assert!(!d.contains("write"), "{d}");
    }

    #[test]
    fn a_rendered_param_is_text_and_a_literal_one_is_json() {
        // `passengers="{{ user_context.n }}"` rendering `2` is the text "2", which matches
        // the number 2; a literal `passengers="2"` is the JSON string "2", which does not
        // (the contract's JSON equality: write `passengers=2`), in `tool` and `expect-tool`
        // alike.
        let turns = [turn(
            0,
            "ok",
            &[("book", r#"{"passengers": 2, "to": "Oslo", "ok": true}"#)],
        )];
        let tool = |params: Value, templates: Vec<(&str, &str)>, loose: bool| {
            let Value::Object(params) = params else {
                panic!("params are an object")
            };
            let criterion = crit(CriterionKind::Tool {
                name: "book".into(),
                params,
                count: None,
                loose,
            });
            let rendered = Rendered {
                values: templates
                    .into_iter()
                    .map(|(k, v)| (ValueSlot::ToolParam(k.into()), v.into()))
                    .collect(),
            };
            check_rendered(
                &criterion,
                &rendered,
                Scope::Turn,
                &turns,
                Some(0),
                Evidence::default(),
            )
            .status
        };
        use serde_json::json;
        for loose in [false, true] {
            let passes = |params, templates| tool(params, templates, loose);
            assert_eq!(
                passes(json!({"passengers": "2"}), vec![]),
                CriterionStatus::Failed
            );
            assert_eq!(
                passes(json!({"passengers": "{{ n }}"}), vec![("passengers", "2")]),
                CriterionStatus::Passed
            );
            assert_eq!(
                passes(json!({"passengers": 2, "ok": true}), vec![]),
                CriterionStatus::Passed
            );
            assert_eq!(
                passes(json!({"passengers": "3"}), vec![]),
                CriterionStatus::Failed
            );
            assert_eq!(
                passes(json!({"passengers": "{{ n }}"}), vec![("passengers", "3")]),
                CriterionStatus::Failed
            );
        }
        // Case is `expect-tool`'s only difference.
        assert_eq!(
            tool(json!({"to": "OSLO"}), vec![], false),
            CriterionStatus::Failed
        );
        assert_eq!(
            tool(json!({"to": "OSLO"}), vec![], true),
            CriterionStatus::Passed
        );
    }

    #[test]
    fn a_json_path_on_a_reply_that_is_not_json_says_so_in_one_line() {
        let path = serde_json_path::JsonPath::parse("$.a").unwrap_or_else(|e| panic!("{e}"));
        let c = crit(CriterionKind::Reply(vec![ReplyCheck::JsonPath {
            path,
            source: "$.a".into(),
            equals: None,
        }]));
        let r = check(&c, Scope::Turn, &[turn(0, "plain text", &[])], Some(0));
        assert_eq!(r.status, CriterionStatus::Failed);
        assert_eq!(
            r.detail.as_deref(),
            Some(
                "json-path $.a: the turn has no structured data and its reply is not JSON: \
                 \"plain text\""
            )
        );
    }

    #[test]
    fn latency_and_turn_limits() {
        let turns = [turn(0, "", &[]), turn(1, "", &[])];
        let c = crit(CriterionKind::Latency {
            max: Duration::from_millis(15),
        });
        assert_eq!(
            check(&c, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Failed
        );
        let c = crit(CriterionKind::Turns { max: 2 });
        assert_eq!(
            check(&c, Scope::Trajectory, &turns, None).status,
            CriterionStatus::Passed
        );
    }
}
