//! The page as plain data: every label, count and clipped text the templates lay out.
//!
//! Order is stable everywhere: scenarios in plan order (the order of the suites and of the
//! scenarios in them), trajectories in the order of their branches, agents in plan order,
//! then repetitions. Names that are internal (node ids such as `accepts/then`) are turned
//! into labels people read ("after «accepts»").

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use base64::Engine as _;
use serde::Serialize;
use sha2::{Digest, Sha256};
use trellis_dsl::graph::{MERGE_LABEL, ROOT_LABEL};
use trellis_records::{
    CriterionRecord, CriterionStatus, Fault, NodeRecord, ScenarioInfo, TrajectoryRecord,
    TrajectoryStatus, TurnRecord,
};

use super::Page;
use super::outline::{MAX_CHIPS, NodeOutcome, ScenarioOutline, failure_node, node_outcomes};
use super::trend::{TrendPoint, Trends};
use crate::NodeKey;
use crate::positions::Positions;
use crate::stats::Name;
use crate::tally::Counts;

/// Longest text block rendered, in characters; the rest is in the Parquet tables.
const MAX_TEXT_CHARS: usize = 20_000;

/// The value of the page's `script-src`: the hash of its one script, so no other script,
/// inline handler or injected element can run even if text ever escaped its escaping.
pub(super) fn script_hash(script: &str) -> String {
    let digest = Sha256::digest(script.as_bytes());
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// Characters of text one page shows in all, before each text is cut much shorter
/// ([`MAX_TEXT_CHARS_PAST_BUDGET`]): 600 repetitions of three 100 KB replies, each cut to
/// [`MAX_TEXT_CHARS`], made a 32 MB page that took 430 MB to write.
const PAGE_TEXT_BUDGET: usize = 4_000_000;

/// Longest text block once the page's budget is spent.
const MAX_TEXT_CHARS_PAST_BUDGET: usize = 400;

thread_local! {
    /// Characters the page being built may still show in full ([`build`] sets it).
    static TEXT_BUDGET: std::cell::Cell<usize> = const { std::cell::Cell::new(PAGE_TEXT_BUDGET) };
}

/// A text block, clipped to [`MAX_TEXT_CHARS`], and shorter once the page has shown
/// [`PAGE_TEXT_BUDGET`] characters.
#[derive(Serialize)]
pub(crate) struct Text {
    text: String,
    /// Characters left out.
    cut: usize,
}

impl Text {
    fn new(text: &str) -> Self {
        let (text, cut_before) = kept(text);
        let left = TEXT_BUDGET.with(std::cell::Cell::get);
        let max = if left == 0 {
            MAX_TEXT_CHARS_PAST_BUDGET
        } else {
            MAX_TEXT_CHARS.min(left)
        };
        let (shown, cut) = clip(text, max);
        TEXT_BUDGET.with(|b| b.set(left.saturating_sub(shown.chars().count())));
        Text {
            text: shown.to_owned(),
            cut: cut + cut_before,
        }
    }
}

/// Ends a text [`keep_for_page`] shortened, before the count of characters it left out.
const KEPT_CUT: &str = "\u{0}trellis-cut:";

/// Shortens the texts of `record`, kept for a transcript the page draws, to what the page
/// can show of each ([`MAX_TEXT_CHARS`] characters), noting how many characters were left
/// out for [`Text::new`] to say. The page holds the node records of every transcript it
/// draws until it is written: kept whole, 150 replies cut at an agent's 8 MiB
/// `max-response-size` took 1.2 GB at the end of the run. What the page never shows (an
/// answer's structured `data`, a message's parts) is dropped.
pub(crate) fn keep_for_page(record: &mut NodeRecord) {
    fn shorten(text: &mut String) {
        let (shown, cut) = clip(text, MAX_TEXT_CHARS);
        if cut > 0 {
            let at = shown.len();
            text.truncate(at);
            text.push_str(KEPT_CUT);
            text.push_str(&cut.to_string());
            text.shrink_to_fit();
        }
    }
    for turn in &mut record.turns {
        // Just parsed, so the record's own: nothing is copied.
        let turn = std::sync::Arc::make_mut(turn);
        shorten(&mut turn.user_message);
        if let Some(reply) = &mut turn.reply {
            shorten(reply);
        }
        turn.data = None;
        // The page shows one line of it: kept as that line.
        turn.metadata = turn
            .metadata
            .take()
            .map(|m| serde_json::Value::String(metadata_line(&m, METADATA_CHARS)));
        for message in &mut turn.messages {
            if let Some(content) = &mut message.content {
                shorten(content);
            }
            for part in &mut message.parts {
                let mut text = part_text(part);
                if text.len() > MAX_TEXT_CHARS {
                    shorten(&mut text);
                    let kind = part.get("type").cloned().unwrap_or_default();
                    *part = serde_json::json!({ "type": kind, KEPT_PART: text });
                }
            }
            for call in &mut message.tool_calls {
                shorten(&mut call.function.arguments);
            }
        }
        for call in &mut turn.tool_calls {
            shorten(&mut call.arguments);
            if let Some(result) = &mut call.result {
                shorten(result);
            }
        }
    }
}

/// The key of a part [`keep_for_page`] shortened, holding its text as the page shows it.
const KEPT_PART: &str = "\u{0}trellis-kept";

/// A message part (AgentScope data and images, Fixie embeds) as the page shows it: its
/// JSON, pretty-printed.
fn part_text(part: &serde_json::Value) -> String {
    match part.get(KEPT_PART).and_then(serde_json::Value::as_str) {
        Some(kept) => kept.to_owned(),
        None => serde_json::to_string_pretty(part).unwrap_or_default(),
    }
}

/// A text as [`keep_for_page`] kept it, and how many characters it left out.
fn kept(text: &str) -> (&str, usize) {
    text.rsplit_once(KEPT_CUT)
        .and_then(|(body, cut)| Some((body, cut.parse().ok()?)))
        .filter(|(body, _)| body.chars().count() == MAX_TEXT_CHARS)
        .unwrap_or((text, 0))
}

/// A history message's text as the report shows it: its content, else the tools it
/// called (an assistant turn of tool calls has no text).
fn history_text(message: &serde_json::Value) -> String {
    if let Some(text) = message
        .get("content")
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
    {
        return text.to_owned();
    }
    let calls: Vec<&str> = message
        .get("tool_calls")
        .and_then(serde_json::Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .filter_map(|c| {
                    c.pointer("/function/name")
                        .and_then(serde_json::Value::as_str)
                })
                .collect()
        })
        .unwrap_or_default();
    if calls.is_empty() {
        String::new()
    } else {
        format!("[calls {}]", calls.join(", "))
    }
}

/// Messages of a scenario's `history` shown with it; the earlier ones are counted.
const MAX_HISTORY_SHOWN: usize = 12;

/// Characters of a turn's agent `metadata` a record kept for the page holds.
const METADATA_CHARS: usize = 200;

/// The line a turn's agent `metadata` is shown as: the text it sent, or its JSON on one
/// line, clipped to `max` characters and the count of the rest. [`keep_for_page`] keeps
/// this line (at [`METADATA_CHARS`]), which the page then shows whole: it clips at a few
/// characters more, room for that count.
fn metadata_line(metadata: &serde_json::Value, max: usize) -> String {
    match metadata {
        serde_json::Value::String(text) => clipped_to(text, max),
        other => clipped_to(&other.to_string(), max),
    }
}

/// A row field or history message as a scenario's facts show it: its first 200 characters,
/// and how many more there were.
fn clipped(text: &str) -> String {
    clipped_to(text, 200)
}

/// `text`'s first `max` characters, and how many more there were.
fn clipped_to(text: &str, max: usize) -> String {
    match clip(text, max) {
        (shown, 0) => shown.to_owned(),
        (shown, cut) => format!("{shown}… ({cut} more characters)"),
    }
}

/// The first `max` characters of `text` and how many characters were cut.
fn clip(text: &str, max: usize) -> (&str, usize) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (
            text.get(..at).unwrap_or(text),
            text.get(at..).map_or(0, |t| t.chars().count()),
        ),
        None => (text, 0),
    }
}

fn ms(value: f64) -> String {
    if !value.is_finite() {
        "–".to_owned()
    } else if value < 1000.0 {
        format!("{value:.0} ms")
    } else {
        format!("{:.2} s", value / 1000.0)
    }
}

/// `1 check`, `12 checks`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".to_owned()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Compact JSON up to this many characters stays on one line.
const ONE_LINE_JSON: usize = 100;

/// JSON text on one line when short, pretty-printed when long, as sent when it does not
/// parse.
fn pretty_json(text: &str) -> String {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return text.to_owned();
    };
    let compact = value.to_string();
    if compact.chars().count() <= ONE_LINE_JSON {
        return compact;
    }
    serde_json::to_string_pretty(&value).unwrap_or(compact)
}

#[derive(Serialize)]
pub(crate) struct Segment {
    class: &'static str,
    x: String,
    width: String,
}

#[derive(Serialize)]
pub(crate) struct CountsView {
    total: u64,
    passed: u64,
    failed: u64,
    errors: u64,
    skipped: u64,
    invalid: u64,
    rate: String,
    /// `all` (everything that ran passed), `some`, `none`, or `na` (nothing ran).
    grade: &'static str,
    segments: Vec<Segment>,
}

impl CountsView {
    fn of(c: &Counts) -> Self {
        Self::drawn_over(c, c.total())
    }

    /// The bar drawn over `whole` trajectories: a run that recorded fewer than it planned
    /// leaves the rest of the bar empty.
    fn drawn_over(c: &Counts, whole: u64) -> Self {
        let ran = c.passed + c.failed + c.errors;
        let grade = match (ran, c.passed) {
            (0, _) => "na",
            (_, 0) => "none",
            (ran, passed) if ran == passed => "all",
            _ => "some",
        };
        let drawn = whole.max(c.total());
        let mut segments = Vec::new();
        let mut x = 0.0;
        for (n, class) in [
            (c.passed, "p"),
            (c.failed, "f"),
            (c.errors, "e"),
            (c.skipped, "s"),
            (c.invalid, "i"),
        ] {
            if n == 0 || drawn == 0 {
                continue;
            }
            let width = n as f64 * 100.0 / drawn as f64;
            segments.push(Segment {
                class,
                x: format!("{x:.3}"),
                width: format!("{width:.3}"),
            });
            x += width;
        }
        CountsView {
            total: c.total(),
            passed: c.passed,
            failed: c.failed,
            errors: c.errors,
            skipped: c.skipped,
            invalid: c.invalid,
            rate: c
                .pass_rate()
                .map_or_else(|| "–".to_owned(), |r| format!("{:.1}%", r * 100.0)),
            grade,
            segments,
        }
    }
}

#[derive(Serialize)]
pub(crate) struct RateRow {
    name: String,
    anchor: Option<String>,
    counts: CountsView,
}

/// How much of the plan the run recorded, when it is not all of it.
#[derive(Serialize)]
pub(crate) struct Coverage {
    recorded: u64,
    planned: u64,
    /// `None` when the run recorded more than it planned (its agents forked).
    percent: Option<String>,
    /// The journal ended properly (Ctrl-C, SIGTERM) rather than being cut off.
    finished: bool,
    /// Every planned trajectory is recorded, yet the run was stopped: some were cut short
    /// ("covers 3 of 3 (100.0%)" read as a whole run).
    all_recorded: bool,
    /// The agent calls the stop dropped unanswered, longest waiting first (the first 10):
    /// what hung, where (`run_finished.abandoned`).
    abandoned: Vec<String>,
    /// How many more there were.
    abandoned_more: usize,
}

#[derive(Serialize)]
pub(crate) struct KeyValue {
    key: String,
    value: String,
}

#[derive(Serialize)]
pub(crate) struct PersonaView {
    id: String,
    kind: String,
    description: String,
    instructions: String,
}

#[derive(Serialize)]
pub(crate) struct Chip {
    label: String,
    status: &'static str,
    anchor: Option<String>,
    title: String,
}

/// One agent's repetitions of one trajectory: pass^k at a glance.
#[derive(Serialize)]
pub(crate) struct AgentReps {
    agent: String,
    chips: Vec<Chip>,
    /// Repetitions counted but not drawn.
    more: usize,
    /// Every repetition not drawn passed.
    more_passed: bool,
    passed: u64,
    ran: u64,
    grade: &'static str,
    /// With repetitions: pass@1 with its 95% Wilson interval, and pass^k for each k.
    estimate: Option<Estimate>,
}

/// What repetitions of one trajectory on one agent say about the agent.
#[derive(Serialize)]
pub(crate) struct Estimate {
    /// `pass@1 67% (95% CI 21–94%)`.
    text: String,
    /// `pass^1 67% · pass^2 33% · pass^3 0%` and pass@k: the detail on hover.
    detail: String,
}

impl Estimate {
    fn of(passed: u64, ran: u64) -> Option<Estimate> {
        use crate::stats::{pass_at_k, pass_hat_k, wilson_interval};
        if ran < 2 {
            return None;
        }
        let rate = passed as f64 / ran as f64;
        let interval = wilson_interval(passed, ran, 0.95)?;
        let pct = |x: f64| format!("{}%", crate::stats::percent_label(x));
        let text = format!("pass@1 {} (95% CI {}%)", pct(rate), interval.label());
        let hats: Vec<String> = (1..=ran.min(10))
            .filter_map(|k| pass_hat_k(ran, passed, k).map(|v| format!("pass^{k} {}", pct(v))))
            .collect();
        let ats: Vec<String> = (1..=ran.min(10))
            .filter_map(|k| pass_at_k(ran, passed, k).map(|v| format!("pass@{k} {}", pct(v))))
            .collect();
        Some(Estimate {
            text,
            detail: format!(
                "from {ran} repetitions: {} (every one of k tries passes) · {} (at least one of k \
                 passes)",
                hats.join(" · "),
                ats.join(" · ")
            ),
        })
    }
}

#[derive(Serialize)]
pub(crate) struct Leaf {
    trajectory: String,
    agents: Vec<AgentReps>,
    show_agents: bool,
    note: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct TreeNode {
    id: String,
    label: String,
    anchor: Option<String>,
    reached: u64,
    passed: u64,
    failed_here: u64,
    failed_above: u64,
    errors_here: u64,
    rate: String,
    grade: &'static str,
    ends: Vec<Leaf>,
    children: Vec<TreeNode>,
}

#[derive(Serialize)]
pub(crate) struct CheckView {
    status: &'static str,
    criterion: String,
    kind: String,
    place: Option<String>,
    detail: Option<Text>,
    /// A multi-metric rubric's scores (Connexity's eight), each with the judge's reasons.
    metrics: Vec<MetricView>,
}

/// One metric of a judged check's rubric, as the judge scored it.
#[derive(Serialize)]
pub(crate) struct MetricView {
    metric: String,
    /// `4/5`.
    score: String,
    /// Below the pass mark of the scale's middle (under 3 of 5): drawn as a failure.
    low: bool,
    label: Option<String>,
    failure_code: Option<String>,
    justification: Option<Text>,
}

#[derive(Serialize)]
pub(crate) struct FaultView {
    category: &'static str,
    message: Text,
}

impl FaultView {
    fn of(fault: &Fault) -> Self {
        FaultView {
            category: fault.category.as_str(),
            message: Text::new(&fault.message),
        }
    }
}

/// What a collapsed row says went wrong first.
#[derive(Serialize)]
pub(crate) struct Headline {
    what: String,
    why: Option<Text>,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Item {
    Intermediate {
        text: Text,
    },
    ToolCall {
        name: String,
        id: String,
        arguments: Text,
        result: Option<Text>,
    },
    ToolResult {
        id: String,
        text: Text,
    },
    Message {
        role: String,
        text: Text,
    },
    Part {
        role: String,
        /// The part's `type`, when it has one (`data`, `image`, …).
        part_type: String,
        text: Text,
    },
}

#[derive(Serialize)]
pub(crate) struct TurnView {
    label: String,
    place: Option<String>,
    meta: Vec<String>,
    replay: bool,
    opener: String,
    user: Text,
    items: Vec<Item>,
    reply: Option<Text>,
    fault: Option<FaultView>,
    checks: Vec<CheckView>,
    /// The agent's OpenTelemetry spans of the turn, as a small waterfall.
    spans: Vec<SpanBar>,
    /// Spans of the turn not drawn ([`MAX_SPAN_BARS`]).
    spans_hidden: usize,
}

/// Spans drawn under a turn at most.
const MAX_SPAN_BARS: usize = 40;

/// One span of a turn's waterfall: where its bar sits on the turn's time axis (0–100).
#[derive(Serialize)]
pub(crate) struct SpanBar {
    name: String,
    /// Nesting under the turn's spans (0: the agent's root), capped for layout.
    depth: usize,
    x: f64,
    width: f64,
    duration: String,
    /// `ok`, `error` or `unset`.
    status: String,
    title: String,
}

/// The waterfall of a turn's spans: bars on one axis from the first start to the last end,
/// indented by nesting.
fn span_bars(spans: &[trellis_records::SpanRecord]) -> (Vec<SpanBar>, usize) {
    let Some(start) = spans.iter().map(|s| s.start_unix_nano).min() else {
        return (Vec::new(), 0);
    };
    let end = spans.iter().map(|s| s.end_unix_nano).max().unwrap_or(start);
    let axis = end.saturating_sub(start).max(1) as f64;
    let depth = |span: &trellis_records::SpanRecord| {
        let mut depth = 0;
        let mut parent = span.parent_span_id.as_deref();
        while let Some(p) = parent {
            match spans.iter().find(|s| s.span_id == p) {
                Some(up) if depth < 6 => {
                    depth += 1;
                    parent = up.parent_span_id.as_deref();
                }
                _ => break,
            }
        }
        depth
    };
    let round = |v: f64| (v * 10.0).round() / 10.0;
    let bars = spans
        .iter()
        .take(MAX_SPAN_BARS)
        .map(|s| {
            let x = s.start_unix_nano.saturating_sub(start) as f64 / axis * 100.0;
            let width = (s.duration_ms() * 1e6 / axis * 100.0).max(0.5);
            let duration = ms(s.duration_ms());
            SpanBar {
                name: s.name.clone(),
                depth: depth(s),
                x: round(x),
                width: round(width.min(100.0 - x).max(0.5)),
                title: format!("{} · {duration} · {}", s.name, s.status),
                duration,
                status: s.status.clone(),
            }
        })
        .collect();
    (bars, spans.len().saturating_sub(MAX_SPAN_BARS))
}

#[derive(Serialize)]
pub(crate) struct Link {
    label: String,
    anchor: Option<String>,
}

/// Other branches a transcript's node links to at most; the rest are counted. Every
/// transcript shown lists its node's siblings, so without a cap a fork of 5,000 branches
/// made a page of transcripts × siblings (143 MB).
const MAX_SIBLING_LINKS: usize = 12;

#[derive(Serialize)]
pub(crate) struct NodeBlock {
    anchor: String,
    id: String,
    label: String,
    shared_by: u32,
    siblings: Vec<Link>,
    /// Siblings past [`MAX_SIBLING_LINKS`], not listed.
    more_siblings: usize,
    turns: Vec<TurnView>,
    /// Why the node's turns are not shown, when its record is not in the journal.
    missing: Option<&'static str>,
}

#[derive(Serialize)]
pub(crate) struct RunView {
    anchor: String,
    status: &'static str,
    suite: String,
    trajectory: String,
    agent: String,
    repetition: u32,
    protocol: String,
    turns: String,
    duration: String,
    tags: Vec<String>,
    headline: Option<Headline>,
    checks_not_run: u64,
    check_summary: String,
    fault: Option<FaultView>,
    skip_reason: Option<String>,
    captures: Vec<KeyValue>,
    /// The forks the agent asked for on this path: what it chose, why, what was left.
    agent_forks: Vec<String>,
    /// The agent's question when the trajectory ended with it waiting for a human.
    awaiting_human: Option<String>,
    /// The tool sandbox's final state, pretty-printed.
    sandbox_state: Option<String>,
    failed_checks: Vec<CheckView>,
    skipped_checks: Vec<CheckView>,
    all_checks: Vec<CheckView>,
    transcript: Vec<NodeBlock>,
    transcript_note: Option<String>,
    open: bool,
}

#[derive(Serialize)]
pub(crate) struct TrendBar {
    x: u32,
    y: String,
    height: String,
    grade: &'static str,
    current: bool,
    title: String,
}

/// A scenario's pass rate over earlier runs and this one, as bars.
#[derive(Serialize)]
pub(crate) struct TrendView {
    width: u32,
    bars: Vec<TrendBar>,
    summary: String,
}

/// Height of the trend's drawing area, in pixels.
const TREND_HEIGHT: f64 = 22.0;
const TREND_STEP: u32 = 9;

fn trend_view(earlier: &[TrendPoint], current: TrendPoint) -> Option<TrendView> {
    if earlier.is_empty() {
        return None;
    }
    let bars_drawn = earlier.len() + 1;
    let bars = earlier
        .iter()
        .chain(std::iter::once(&current))
        .enumerate()
        .map(|(i, p)| {
            let rate = (p.ran > 0).then(|| p.passed as f64 / p.ran as f64);
            let height = rate.map_or(2.0, |r| (r * TREND_HEIGHT).max(2.0));
            let grade = match (p.ran, p.passed) {
                (0, _) => "na",
                (_, 0) => "none",
                (ran, passed) if ran == passed => "all",
                _ => "some",
            };
            TrendBar {
                x: u32::try_from(i)
                    .unwrap_or(u32::MAX)
                    .saturating_mul(TREND_STEP),
                y: format!("{:.1}", TREND_HEIGHT - height),
                height: format!("{height:.1}"),
                grade,
                current: i + 1 == bars_drawn,
                title: format!(
                    "{}{} · {}: {}/{} passed ({})",
                    if i + 1 == bars_drawn {
                        "this run · "
                    } else {
                        ""
                    },
                    p.run_id,
                    p.started_at,
                    p.passed,
                    p.ran,
                    percent(p.passed, p.ran)
                ),
            }
        })
        .collect();
    Some(TrendView {
        width: u32::try_from(bars_drawn)
            .unwrap_or(u32::MAX)
            .saturating_mul(TREND_STEP),
        bars,
        summary: count(earlier.len() as u64, "earlier run", "earlier runs"),
    })
}

#[derive(Serialize)]
pub(crate) struct ScenarioView {
    anchor: String,
    suite: String,
    id: String,
    name: Option<String>,
    description: Option<String>,
    persona: Option<PersonaView>,
    user_context: Vec<KeyValue>,
    /// An instance's dataset row (`for-each`), its fields clipped.
    row: Vec<KeyValue>,
    /// Where the row comes from: `dataset D, row id R`.
    row_of: Option<String>,
    /// The `history` the trajectories opened with, as sent: role and text, clipped, at
    /// most [`MAX_HISTORY_SHOWN`] messages (the last ones), and how many more.
    history: Vec<KeyValue>,
    history_more: u64,
    agents: Vec<String>,
    tags: Vec<String>,
    repeat: u32,
    counts: CountsView,
    trend: Option<TrendView>,
    coverage: Option<String>,
    tree: Vec<TreeNode>,
    unrun: Vec<Leaf>,
    runs: Vec<RunView>,
    omitted_runs: u64,
}

/// Scenarios of one suite run against several agents: one row per scenario, one column
/// per agent.
#[derive(Serialize)]
pub(crate) struct AgentGrid {
    suite: String,
    agents: Vec<String>,
    rows: Vec<AgentGridRow>,
}

#[derive(Serialize)]
pub(crate) struct AgentGridRow {
    name: String,
    anchor: Option<String>,
    /// Per agent: the pass rate with its 95% interval and grade; `None` where the agent
    /// did not run the scenario.
    cells: Vec<Option<GridCell>>,
}

#[derive(Serialize)]
pub(crate) struct GridCell {
    rate: String,
    interval: String,
    grade: &'static str,
}

/// A `matrix` scenario's pass rates by one variable's values (`crate::pivot`).
#[derive(Serialize)]
pub(crate) struct MatrixGridView {
    suite: String,
    var: String,
    values: Vec<String>,
    rows: Vec<AgentGridRow>,
}

fn matrix_grids(
    suites: &[String],
    scenarios: &[trellis_records::ScenarioInfo],
    counts: &BTreeMap<(Name, Name, Name), Counts>,
    anchors: &BTreeMap<(String, String), String>,
) -> Vec<MatrixGridView> {
    let counts = counts.iter().map(|((suite, scenario, agent), c)| {
        (
            &**suite,
            &**scenario,
            &**agent,
            c.passed,
            c.passed + c.failed + c.errors,
        )
    });
    crate::pivot::matrix_grids(suites, scenarios, counts)
        .into_iter()
        .map(|g| MatrixGridView {
            rows: g
                .rows
                .into_iter()
                .map(|row| AgentGridRow {
                    name: match &row.agent {
                        Some(agent) => format!("{} [{agent}]", row.scenario),
                        None => row.scenario.clone(),
                    },
                    anchor: anchors.get(&(g.suite.clone(), row.scenario)).cloned(),
                    cells: row
                        .cells
                        .into_iter()
                        .map(|cell| {
                            let (passed, ran) = cell?;
                            let (_, interval) = crate::pivot::cell_text((passed, ran));
                            let view = CountsView::of(&Counts {
                                passed,
                                failed: ran - passed,
                                ..Counts::default()
                            });
                            // As the agents' grid shows its cells.
                            Some(GridCell {
                                rate: view.rate,
                                interval,
                                grade: view.grade,
                            })
                        })
                        .collect(),
                })
                .collect(),
            suite: g.suite,
            var: g.var,
            values: g.values,
        })
        .collect()
}

/// The grids of the suites whose scenarios ran against several agents, suites in load
/// order, agents in plan order.
fn agent_grids(
    suites: &[String],
    agents: &[String],
    counts: &BTreeMap<(Name, Name, Name), Counts>,
    drawn: &[ScenarioView],
) -> Vec<AgentGrid> {
    let mut grids = Vec::new();
    for suite in suites {
        // Each scenario's agents with their counts, so that a cell is found by its agent.
        let mut scenarios: BTreeMap<&str, Vec<(&str, &Counts)>> = BTreeMap::new();
        for ((s, scenario, agent), c) in counts {
            if **s == **suite {
                scenarios.entry(scenario).or_default().push((agent, c));
            }
        }
        scenarios.retain(|_, a| a.len() > 1);
        let columns: Vec<String> = agents
            .iter()
            .filter(|a| {
                scenarios
                    .values()
                    .any(|list| list.iter().any(|(b, _)| *b == a.as_str()))
            })
            .cloned()
            .collect();
        if columns.len() < 2 {
            continue;
        }
        // Rows in the order the page draws its scenarios (`scenario_order`: the plan's, so
        // a matrix's instances as the matrix lists its values, `n=2` before `n=10`).
        let rows = drawn
            .iter()
            .filter(|v| v.suite == *suite)
            .filter_map(|v| Some((v, scenarios.get(v.id.as_str())?)))
            .map(|(v, of_agents)| AgentGridRow {
                name: v.id.clone(),
                anchor: Some(v.anchor.clone()),
                cells: columns
                    .iter()
                    .map(|agent| {
                        let (_, c) = of_agents.iter().find(|(a, _)| *a == agent.as_str())?;
                        let view = CountsView::of(c);
                        let ran = c.passed + c.failed + c.errors;
                        let interval = crate::stats::wilson_interval(c.passed, ran, 0.95)
                            .map_or_else(String::new, |i| format!("{}%", i.label()));
                        Some(GridCell {
                            rate: view.rate,
                            interval,
                            grade: view.grade,
                        })
                    })
                    .collect(),
            })
            .collect();
        grids.push(AgentGrid {
            suite: suite.clone(),
            agents: columns,
            rows,
        });
    }
    grids
}

#[derive(Serialize)]
pub(crate) struct StatusCount {
    status: &'static str,
    count: usize,
}

/// A loopback agent's address and the connection attempts its full accept queue dropped.
#[derive(Serialize)]
pub(crate) struct RedoneView {
    address: String,
    attempts: u64,
}

/// One role's LLM use (`agent`, `simulator`, `judge`, `attacker`), from the run's summary.
#[derive(Serialize)]
pub(crate) struct RoleView {
    role: String,
    calls: u64,
    cache_hits: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct PageView {
    run_id: String,
    /// `variance.json` (`trellis variance`), when the run directory has one.
    variance: Option<crate::variance::VarianceReport>,
    /// LLM use per role; empty when the run made no LLM call (or did not finish).
    llm_roles: Vec<RoleView>,
    /// Why the run stopped early on its own (an LLM budget).
    stopped_by: Option<String>,
    /// Loopback agents whose full accept queue dropped connection attempts.
    connections_redone: Vec<RedoneView>,
    /// Long-lived agent processes that ended under requests, and how many (by command).
    requests_resent: Vec<(String, u64)>,
    started_at: String,
    finished_at: Option<String>,
    duration: Option<String>,
    version: String,
    suites: Vec<String>,
    coverage: Option<Coverage>,
    /// A shard's, or a merged run's, sentence about what it covers.
    provenance: Option<String>,
    /// The baseline run (`run --baseline`) whose comparison is in `compare.html`.
    compared_with: Option<String>,
    skipped_lines: usize,
    transcripts_missing: Option<String>,
    checks_skipped: Option<String>,
    totals: CountsView,
    turns: u64,
    checks_not_run: u64,
    by_suite: Vec<RateRow>,
    by_scenario: Vec<RateRow>,
    by_agent: Vec<RateRow>,
    agent_grids: Vec<AgentGrid>,
    matrix_grids: Vec<MatrixGridView>,
    scenarios: Vec<ScenarioView>,
    filter_suites: Vec<String>,
    filter_agents: Vec<String>,
    status_counts: Vec<StatusCount>,
    rows: usize,
    omitted: Option<String>,
}

/// Splits a recorded node name into the planned node and the alternatives of the forks the
/// agent asked for on the way (`accepts~voucher~large` → `accepts`, [`voucher`, `large`]).
fn agent_forks(id: &str) -> (&str, Vec<&str>) {
    let mut parts = id.split('~');
    let planned = parts.next().unwrap_or(id);
    (planned, parts.collect())
}

fn agent_fork_text(labels: &[&str]) -> String {
    labels
        .iter()
        .map(|l| format!("«{l}»"))
        .collect::<Vec<_>>()
        .join(" › ")
}

/// Whether a runtime fork's label is an attack search's (`a2-1`: depth 2, proposal 1; see
/// `engine/src/execute/attack.rs`) rather than an alternative the agent named.
fn is_attack_label(label: &str) -> bool {
    label
        .strip_prefix('a')
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(depth, n)| {
            [depth, n]
                .iter()
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The runtime forks of a node, each run of the same kind introduced by its words: the
/// agent's branches by `agent`, the attack search's by `attack`.
fn forks_text(labels: &[&str], agent: &str, attack: &str) -> String {
    let mut groups: Vec<(bool, Vec<&str>)> = Vec::new();
    for label in labels {
        let kind = is_attack_label(label);
        match groups.last_mut() {
            Some((last, group)) if *last == kind => group.push(label),
            _ => groups.push((kind, vec![label])),
        }
    }
    groups
        .iter()
        .map(|(kind, group)| {
            let words = if *kind { attack } else { agent };
            format!("{words} {}", agent_fork_text(group))
        })
        .collect::<Vec<_>>()
        .join(" › ")
}

/// Where a node sits in the conversation, for people: `None` for the root of a scenario
/// that never forks.
fn node_place(id: &str, forks: bool) -> Option<String> {
    let (planned, labels) = agent_forks(id);
    if !labels.is_empty() {
        let fork = format!(
            "after {}",
            forks_text(&labels, "the agent's fork", "the attacker's message")
        );
        return Some(match planned_place(planned, true) {
            Some(place) if planned != ROOT_LABEL => format!("{place}, {fork}"),
            _ => fork,
        });
    }
    planned_place(id, forks)
}

fn planned_place(id: &str, forks: bool) -> Option<String> {
    let segments: Vec<&str> = id.split('/').collect();
    match segments.as_slice() {
        [root] if *root == ROOT_LABEL => forks.then(|| "before the fork".to_owned()),
        [.., last] if *last == MERGE_LABEL => {
            let branch = segments
                .iter()
                .rev()
                .find(|s| **s != MERGE_LABEL)
                .copied()
                .unwrap_or(ROOT_LABEL);
            Some(format!("after «{branch}», where the branches rejoin"))
        }
        [.., last] => Some(format!("after the fork «{last}»")),
        [] => None,
    }
}

/// A node's title in the tree and above its turns.
fn node_label(id: &str, forks: bool) -> String {
    let (planned, labels) = agent_forks(id);
    if !labels.is_empty() {
        let fork = forks_text(&labels, "agent's branch", "attack");
        return if planned == ROOT_LABEL {
            fork
        } else {
            format!("{} · {fork}", planned_label(planned, true))
        };
    }
    planned_label(id, forks)
}

fn planned_label(id: &str, forks: bool) -> String {
    let segments: Vec<&str> = id.split('/').collect();
    match segments.as_slice() {
        [root] if *root == ROOT_LABEL => {
            if forks {
                "shared start".to_owned()
            } else {
                "conversation".to_owned()
            }
        }
        [.., last] if *last == MERGE_LABEL => {
            let branch = segments
                .iter()
                .rev()
                .find(|s| **s != MERGE_LABEL)
                .copied()
                .unwrap_or(ROOT_LABEL);
            format!("after «{branch}»")
        }
        [.., last] => format!("branch «{last}»"),
        [] => id.to_owned(),
    }
}

fn trajectory_label(name: &str) -> String {
    let (planned, labels) = agent_forks(name);
    if !labels.is_empty() {
        return format!(
            "{} → {}",
            trajectory_label(planned),
            forks_text(&labels, "agent's branch", "attack")
        );
    }
    if name == "main" {
        "main".to_owned()
    } else {
        name.split('/')
            .map(|b| format!("«{b}»"))
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

fn check_view(c: &CriterionRecord, forks_at: &dyn Fn(u32) -> Option<String>) -> CheckView {
    CheckView {
        status: c.status.as_str(),
        criterion: c.criterion.clone(),
        kind: c.kind.clone(),
        place: c.turn_index.map(|i| match forks_at(i) {
            Some(place) => format!("turn {i}, {place}"),
            None => format!("turn {i}"),
        }),
        detail: c.detail.as_deref().map(Text::new),
        metrics: c
            .judge
            .iter()
            .flat_map(|j| &j.metrics)
            .map(|m| MetricView {
                metric: m.metric.clone(),
                score: format!("{}/5", trim_number(m.score)),
                low: m.score < 3.0,
                label: m.label.clone(),
                failure_code: m.failure_code.clone(),
                justification: m.justification.as_deref().map(Text::new),
            })
            .collect(),
    }
}

/// `4` for 4.0, `3.5` for 3.5: scores as people write them.
fn trim_number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// The scenarios in the order the page shows them: plan order, then any the journal has
/// that the plan did not list (an older journal), by name. Borrowed from the page's data:
/// a dataset's 20,000 instances were 120,000 copies of their names, and an ordered set of
/// all of them to find none missing from the plan.
fn scenario_order<'a>(page: &Page<'a>) -> Vec<(&'a str, &'a str, Option<&'a ScenarioInfo>)> {
    let mut seen: HashSet<(&str, &str), foldhash::fast::FixedState> = HashSet::default();
    let mut order = Vec::with_capacity(page.info.scenarios.len());
    for info in &page.info.scenarios {
        if seen.insert((info.suite.as_str(), info.scenario.as_str())) {
            order.push((info.suite.as_str(), info.scenario.as_str(), Some(info)));
        }
    }
    let tally: &'a crate::tally::Tally = page.tally;
    let outline: &'a crate::html::Outline = page.outline;
    let unplanned: BTreeSet<(&'a str, &'a str)> = tally
        .by_scenario
        .keys()
        .map(|(suite, scenario)| (&**suite, &**scenario))
        .chain(
            outline
                .keys()
                .map(|(suite, scenario)| (suite.as_str(), scenario.as_str())),
        )
        .filter(|key| !seen.contains(key))
        .collect();
    order.extend(
        unplanned
            .into_iter()
            .map(|(suite, scenario)| (suite, scenario, None)),
    );
    order
}

/// Each scenario's counts by its names, borrowed: the tally's map is keyed by shared names,
/// which a lookup by text would have to build.
fn counts_by_scenario<'a>(
    page: &Page<'a>,
) -> HashMap<(&'a str, &'a str), Counts, foldhash::fast::FixedState> {
    let tally: &'a crate::tally::Tally = page.tally;
    tally
        .by_scenario
        .iter()
        .map(|((suite, scenario), counts)| ((&**suite, &**scenario), *counts))
        .collect()
}

/// Scenario sections (and rows of the scenario tables) the page draws at most: a suite
/// over a dataset of 10,000 rows has 10,000 scenarios, and a section for each made an 18 MB
/// page that took seconds to open. The totals always count every scenario.
const MAX_SCENARIO_SECTIONS: usize = 200;

/// Positions in `order` of the scenarios the page draws: all of them when they are few;
/// else, up to [`MAX_SCENARIO_SECTIONS`], those with a trajectory that did not pass, then
/// the rest; in each group the largest (trajectory runs) first, then those whose
/// transcripts the page shows, then in `order`.
fn drawn_scenarios(
    page: &Page<'_>,
    order: &[(&str, &str, Option<&ScenarioInfo>)],
    counts: &HashMap<(&str, &str), Counts, foldhash::fast::FixedState>,
) -> BTreeSet<usize> {
    if order.len() <= MAX_SCENARIO_SECTIONS {
        return (0..order.len()).collect();
    }
    let with_transcripts: HashSet<(&str, &str)> = page
        .rendered
        .trajectories
        .iter()
        .map(|t| (t.suite.as_str(), t.scenario.as_str()))
        .collect();
    let failing = |&(suite, scenario, _): &(&str, &str, Option<&ScenarioInfo>)| {
        counts
            .get(&(suite, scenario))
            .is_some_and(|c| c.total() > c.passed)
    };
    // The larger first (a branching scenario of 60 trajectories before the one-turn
    // instances of a dataset, which read alike and whose transcripts the page would
    // otherwise have picked in plan order), then those whose transcripts the page shows.
    let size = |&(suite, scenario, _): &(&str, &str, Option<&ScenarioInfo>)| {
        counts.get(&(suite, scenario)).map_or(0, Counts::total)
    };
    let shown = |&(suite, scenario, _): &(&str, &str, Option<&ScenarioInfo>)| {
        with_transcripts.contains(&(suite, scenario))
    };
    let mut ranked: Vec<(bool, std::cmp::Reverse<u64>, bool, usize)> = order
        .iter()
        .enumerate()
        .map(|(index, s)| (!failing(s), std::cmp::Reverse(size(s)), !shown(s), index))
        .collect();
    ranked.sort_unstable();
    ranked
        .into_iter()
        .take(MAX_SCENARIO_SECTIONS)
        .map(|(_, _, _, index)| index)
        .collect()
}

/// What the scenarios the page does not draw add up to.
#[derive(Default)]
struct Undrawn {
    scenarios: u64,
    not_passing: u64,
    /// The first [`UNDRAWN_NAMED`] of the scenarios not drawn with a trajectory that did
    /// not pass, `suite / scenario`: named in the page's note, so that a failure the page
    /// had no room to draw is still found by its name (and the search).
    not_passing_names: Vec<String>,
    counts: Counts,
}

/// Scenarios not drawn, and not passing, that the page's note names at most.
const UNDRAWN_NAMED: usize = 100;

impl Undrawn {
    fn add(&mut self, (suite, scenario): (&str, &str), counts: &Counts) {
        self.scenarios += 1;
        if counts.total() > counts.passed {
            self.not_passing += 1;
            if self.not_passing_names.len() < UNDRAWN_NAMED {
                self.not_passing_names.push(format!("{suite} / {scenario}"));
            }
        }
        self.counts.passed += counts.passed;
        self.counts.failed += counts.failed;
        self.counts.errors += counts.errors;
        self.counts.skipped += counts.skipped;
        self.counts.invalid += counts.invalid;
    }
}

/// `items` without repeats, first occurrence kept (a suite and its scenario may both carry
/// a tag).
fn distinct(items: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}

/// Position of `name` in `plan`, names the plan does not know after it.
fn rank(plan: &[String], name: &str) -> usize {
    plan.iter().position(|n| n == name).unwrap_or(plan.len())
}

/// Per-scenario index of names for anchors: anchors are built from positions, never from
/// names, so no suite text ever reaches an `id` or `href`.
struct Anchors {
    scenario: String,
    trajectories: Vec<String>,
    agents: Vec<String>,
    /// Where each of `trajectories` and of the nodes is: a scenario may have 100,000
    /// trajectories and twice as many nodes, and finding each by a scan of its list took
    /// the square of that.
    trajectory_at: Positions,
    node_at: Positions,
}

impl Anchors {
    fn run(&self, trajectory: &str, agent: &str, repetition: u32) -> String {
        format!(
            "{}-t{}-a{}-r{repetition}",
            self.scenario,
            self.trajectory_at.rank(trajectory),
            rank(&self.agents, agent)
        )
    }

    fn node(&self, run: &str, node: &str) -> String {
        format!("{run}-n{}", self.node_at.rank(node))
    }
}

/// Unanswered calls of a stopped run listed by name in its banner.
const ABANDONED_SHOWN: usize = 10;

pub(crate) fn build(page: &Page<'_>) -> PageView {
    TEXT_BUDGET.with(|b| b.set(PAGE_TEXT_BUDGET));
    let info = page.info;
    let total = &page.tally.total;
    let interrupted = page.finished.is_some_and(|f| f.interrupted);
    let coverage = (total.total() < info.planned_trajectories
        || page.finished.is_none()
        || interrupted)
        .then(|| Coverage {
            recorded: total.total(),
            planned: info.planned_trajectories,
            // Trajectories an agent forked are not planned: a stopped run of such an agent
            // can record more than its plan, and a share of it would say more than 100%.
            percent: (total.total() <= info.planned_trajectories)
                .then(|| percent(total.total(), info.planned_trajectories)),
            finished: page.finished.is_some(),
            // Stopped (not cut off): its journal says the stop left work undone.
            all_recorded: interrupted && total.total() == info.planned_trajectories,
            abandoned: page
                .finished
                .iter()
                .flat_map(|f| &f.abandoned)
                .take(ABANDONED_SHOWN)
                .map(trellis_records::AbandonedCall::describe)
                .collect(),
            abandoned_more: page
                .finished
                .map_or(0, |f| f.abandoned.len().saturating_sub(ABANDONED_SHOWN)),
        });
    let checks_skipped = (page.tally.checks_skipped > 0).then(|| {
        format!(
            "{} did not run, on {}: a trajectory whose checks did not run is not evidence \
             that the agent passes them ({}).",
            count(page.tally.checks_skipped, "check", "checks"),
            count(
                page.tally.trajectories_with_skipped_checks,
                "trajectory",
                "trajectories"
            ),
            if info.strict {
                "this run was made with --strict: those trajectories failed"
            } else {
                "see --strict"
            }
        )
    });

    let mut scenarios = Vec::new();
    let mut by_scenario = Vec::new();
    let order = scenario_order(page);
    let counts_of = counts_by_scenario(page);
    let drawn = drawn_scenarios(page, &order, &counts_of);
    let trends = page.trends.load(
        page.info,
        &drawn
            .iter()
            .filter_map(|&i| order.get(i))
            .map(|&(suite, scenario, _)| (suite, scenario))
            .collect(),
    );
    let mut undrawn = Undrawn::default();
    for (index, (suite, scenario, plan)) in order.into_iter().enumerate() {
        let counts = counts_of
            .get(&(suite, scenario))
            .copied()
            .unwrap_or_default();
        if !drawn.contains(&index) {
            undrawn.add((suite, scenario), &counts);
            continue;
        }
        let view = scenario_view(page, &trends, index, (suite, scenario), plan, counts);
        by_scenario.push(RateRow {
            name: format!("{suite} / {scenario}"),
            anchor: Some(view.anchor.clone()),
            counts: CountsView::of(&counts),
        });
        scenarios.push(view);
    }
    if undrawn.scenarios > 0 {
        by_scenario.push(RateRow {
            name: format!(
                "… {} not drawn on this page",
                count(undrawn.scenarios, "more scenario", "more scenarios")
            ),
            anchor: None,
            counts: CountsView::of(&undrawn.counts),
        });
    }
    let drawn_keys: HashSet<(&str, &str)> = scenarios
        .iter()
        .map(|v| (v.suite.as_str(), v.id.as_str()))
        .collect();
    let is_drawn =
        |t: &TrajectoryRecord| drawn_keys.contains(&(t.suite.as_str(), t.scenario.as_str()));

    let mut filter_agents: Vec<String> = Vec::new();
    for info in &info.scenarios {
        for agent in &info.agents {
            if !filter_agents.contains(agent) {
                filter_agents.push(agent.clone());
            }
        }
    }
    for agent in page.tally.by_agent.keys() {
        if !filter_agents.iter().any(|a| **a == **agent) {
            filter_agents.push(agent.to_string());
        }
    }
    let mut filter_suites: Vec<String> = info.suites.clone();
    for suite in page.tally.by_suite.keys() {
        if !filter_suites.iter().any(|s| **s == **suite) {
            filter_suites.push(suite.to_string());
        }
    }
    // Transcripts of scenarios not drawn have no section to sit in.
    let rendered: Vec<&TrajectoryRecord> = page
        .rendered
        .trajectories
        .iter()
        .filter(|t| is_drawn(t))
        .collect();
    let (hidden_failing, hidden_passing) = page
        .rendered
        .trajectories
        .iter()
        .filter(|t| !is_drawn(t))
        .fold((0, 0), |(f, p), t| match t.status {
            TrajectoryStatus::Passed => (f, p + 1),
            _ => (f + 1, p),
        });
    let omitted_failing = page.rendered.omitted_failing + hidden_failing;
    let omitted_passing = page.rendered.omitted_passing + hidden_passing;
    let status_counts = [
        TrajectoryStatus::Failed,
        TrajectoryStatus::Error,
        TrajectoryStatus::Invalid,
        TrajectoryStatus::Skipped,
        TrajectoryStatus::Passed,
    ]
    .into_iter()
    .map(|status| StatusCount {
        status: status.as_str(),
        count: rendered.iter().filter(|t| t.status == status).count(),
    })
    .collect();
    let omitted_trajectories = (omitted_failing > 0 || omitted_passing > 0).then(|| {
        let mut parts = Vec::new();
        if omitted_failing > 0 {
            parts.push(count(
                omitted_failing,
                "non-passing trajectory",
                "non-passing trajectories",
            ));
        }
        if omitted_passing > 0 {
            parts.push(count(
                omitted_passing,
                "passing trajectory",
                "passing trajectories",
            ));
        }
        format!(
            "Not listed here: {} (the page keeps to a readable size); the trees count \
             them, trajectories.parquet has every trajectory and turns.parquet every turn.",
            parts.join(" and ")
        )
    });
    let omitted_scenarios = (undrawn.scenarios > 0).then(|| {
        let not_passing = if undrawn.not_passing == 0 {
            format!(
                "every one of their {} passed",
                count(undrawn.counts.total(), "trajectory", "trajectories")
            )
        } else {
            format!(
                "{} of their {} did not pass",
                undrawn.counts.total() - undrawn.counts.passed,
                count(undrawn.counts.total(), "trajectory", "trajectories")
            )
        };
        let named = match undrawn.not_passing_names.as_slice() {
            [] => String::new(),
            names => format!(
                " Not drawn and not all passed: {}{}.",
                names.join(", "),
                match undrawn.not_passing - names.len() as u64 {
                    0 => String::new(),
                    more => format!(", and {more} more"),
                }
            ),
        };
        format!(
            "Not drawn here: {} of {} scenarios ({not_passing}); the page draws at most {} \
             of them, those with a trajectory that did not pass first.{named} The totals and \
             the last row of \"By scenario\" count them; trajectories.parquet has every one.",
            undrawn.scenarios,
            drawn.len() as u64 + undrawn.scenarios,
            MAX_SCENARIO_SECTIONS
        )
    });
    let omitted = match (omitted_scenarios, omitted_trajectories) {
        (Some(s), Some(t)) => Some(format!("{s} {t}")),
        (s, t) => s.or(t),
    };

    PageView {
        run_id: info.run_id.clone(),
        variance: page.variance.cloned(),
        llm_roles: page
            .finished
            .map(|f| {
                f.llm_roles
                    .iter()
                    .map(|(role, u)| RoleView {
                        role: role.clone(),
                        calls: u.calls,
                        cache_hits: u.cache_hits,
                        input_tokens: u.input_tokens,
                        output_tokens: u.output_tokens,
                        cost: u.cost.map(|c| format!("{c:.4}")),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        stopped_by: page.finished.and_then(|f| f.stopped_by.clone()),
        connections_redone: page
            .finished
            .map(|f| {
                f.connections_redone
                    .iter()
                    .map(|(address, &attempts)| RedoneView {
                        address: address.clone(),
                        attempts,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        requests_resent: page
            .finished
            .map(|f| {
                f.requests_resent
                    .iter()
                    .map(|(command, &n)| (command.clone(), n))
                    .collect()
            })
            .unwrap_or_default(),
        started_at: info.started_at.clone(),
        finished_at: page.finished.map(|f| f.finished_at.clone()),
        duration: page.finished.map(|f| ms(f.duration_ms)),
        version: info.trellis_version.clone(),
        suites: info.suites.clone(),
        coverage,
        provenance: page.provenance.map(str::to_owned),
        compared_with: page.compared_with.map(str::to_owned),
        skipped_lines: page.skipped_lines,
        transcripts_missing: page.transcripts_missing.map(str::to_owned),
        checks_skipped,
        totals: CountsView::drawn_over(total, info.planned_trajectories),
        turns: page.tally.turns,
        checks_not_run: page.tally.checks_skipped,
        // Suites in load order and agents in plan order, like everything else on the page.
        by_suite: rate_rows(&filter_suites, &page.tally.by_suite),
        by_scenario,
        by_agent: rate_rows(&filter_agents, &page.tally.by_agent),
        agent_grids: agent_grids(
            &filter_suites,
            &filter_agents,
            // The drawn scenarios' rows: the grid is per scenario, as the tables are.
            &page
                .tally
                .by_scenario_agent
                .iter()
                .filter(|((suite, scenario, _), _)| drawn_keys.contains(&(&**suite, &**scenario)))
                .map(|(key, counts)| (key.clone(), *counts))
                .collect(),
            &scenarios,
        ),
        matrix_grids: matrix_grids(
            &filter_suites,
            &info.scenarios,
            &page.tally.by_scenario_agent,
            &scenarios
                .iter()
                .map(|v| ((v.suite.clone(), v.id.clone()), v.anchor.clone()))
                .collect(),
        ),
        scenarios,
        filter_suites,
        filter_agents,
        status_counts,
        rows: rendered.len(),
        omitted,
    }
}

/// A pass-rate row for each name in `order` that has counts.
fn rate_rows(order: &[String], counts: &BTreeMap<Name, Counts>) -> Vec<RateRow> {
    order
        .iter()
        .filter_map(|name| {
            counts.get(name.as_str()).map(|c| RateRow {
                name: name.clone(),
                anchor: None,
                counts: CountsView::of(c),
            })
        })
        .collect()
}

/// The section of the scenario at `index` of the page's order, whose trajectories counted
/// `counts` (as `build` found them for its tables).
fn scenario_view(
    page: &Page<'_>,
    trends: &Trends,
    index: usize,
    (suite, scenario): (&str, &str),
    plan: Option<&ScenarioInfo>,
    counts: Counts,
) -> ScenarioView {
    let empty = ScenarioOutline::default();
    let outline = page.outline.scenario(suite, scenario).unwrap_or(&empty);

    // Trajectories and agents in plan order, then any the plan did not list.
    let mut trajectories: Vec<String> = plan.map(|p| p.trajectories.clone()).unwrap_or_default();
    let planned_count = trajectories.len();
    // Continuations of forks the agent asked for follow the planned trajectory they
    // continue, in the order the agent listed the alternatives.
    let mut continuations: Vec<(usize, Vec<u32>, String)> = Vec::new();
    // Where each name is in `trajectories` as it grows (a scan of it for each path took
    // the square of a wide scenario's paths).
    let mut listed: HashMap<&str, usize> = HashMap::new();
    for (i, name) in plan.iter().flat_map(|p| &p.trajectories).enumerate() {
        listed.entry(name.as_str()).or_insert(i);
    }
    for (name, _) in &outline.paths {
        if listed.contains_key(name.as_str()) {
            continue;
        }
        let (planned, labels) = agent_forks(name);
        if labels.is_empty() {
            listed.insert(name.as_str(), trajectories.len());
            trajectories.push(name.clone());
        } else {
            let position = outline
                .fork_positions
                .get(name)
                .cloned()
                .unwrap_or_default();
            let base = listed.get(planned).copied().unwrap_or(trajectories.len());
            continuations.push((base, position, name.clone()));
        }
    }
    continuations.sort();
    for (base, _, name) in continuations.into_iter().rev() {
        // Right after the planned trajectory: inserting in reverse leaves them in order.
        let at = if base < planned_count {
            base + 1
        } else {
            trajectories.len()
        };
        trajectories.insert(at, name);
    }
    let mut agents: Vec<String> = plan.map(|p| p.agents.clone()).unwrap_or_default();
    for runs in &outline.runs {
        for (agent, _) in runs {
            if !agents.iter().any(|a| *a == **agent) {
                agents.push(agent.to_string());
            }
        }
    }
    let trajectory_at = Positions::of(trajectories.iter().map(String::as_str));
    let paths: Vec<(&String, &Vec<String>)> = {
        let mut paths: Vec<(&String, &Vec<String>)> = outline
            .paths
            .iter()
            .filter(|(_, nodes)| !nodes.is_empty())
            .map(|(name, nodes)| (name, nodes))
            .collect();
        paths.sort_by_key(|(name, _)| trajectory_at.rank(name));
        paths
    };
    // Every node of the paths, in the order they first come.
    let node_at = Positions::of(
        paths
            .iter()
            .flat_map(|(_, path)| path.iter().map(String::as_str)),
    );
    let forks = paths.len() > 1 || trajectories.len() > 1;
    let anchors = Anchors {
        scenario: format!("s{index}"),
        trajectories,
        agents,
        trajectory_at,
        node_at,
    };

    // The rows: rendered trajectories of this scenario, in stable order.
    let mut rows: Vec<&TrajectoryRecord> = page
        .rendered
        .trajectories
        .iter()
        .filter(|t| t.suite == suite && t.scenario == scenario)
        .collect();
    rows.sort_by_key(|t| {
        (
            anchors.trajectory_at.rank(&t.trajectory),
            rank(&anchors.agents, &t.agent),
            t.repetition,
        )
    });
    let rendered: HashSet<(&str, &str, u32)> = rows
        .iter()
        .map(|t| (t.trajectory.as_str(), t.agent.as_str(), t.repetition))
        .collect();

    // Where each rendered run went wrong, for the tree's links to transcripts.
    let rendered_runs: Vec<RenderedRun<'_>> = rows
        .iter()
        .map(|t| RenderedRun {
            trajectory: &t.trajectory,
            agent: &t.agent,
            repetition: t.repetition,
            failed_at: failure_node(outline, t),
            nodes: &t.nodes,
        })
        .collect();
    let tree = tree_view(outline, &paths, &anchors, &rendered, &rendered_runs, forks);
    let next = next_nodes(&paths);
    // A planned trajectory the agent forked ran as its continuations (`NAME~LABEL`): a
    // name ran when a path is it, or is it followed by `~`.
    let mut ran: HashSet<&str> = HashSet::new();
    for (p, _) in &paths {
        ran.insert(p.as_str());
        for (at, _) in p.match_indices('~') {
            ran.insert(&p[..at]);
        }
    }
    let unrun: Vec<Leaf> = anchors
        .trajectories
        .iter()
        .filter(|name| !ran.contains(name.as_str()))
        .map(|name| {
            let mut leaf = leaf_view(outline, name, &anchors, &rendered);
            if leaf.agents.is_empty() {
                leaf.note = Some("not recorded: the run stopped before it".to_owned());
            }
            leaf
        })
        .collect();

    let coverage = plan.and_then(|p| {
        let planned = p.trajectories.len() as u64 * p.agents.len() as u64 * u64::from(p.repeat);
        (counts.total() < planned).then(|| {
            format!(
                "{} of {} planned trajectories recorded",
                counts.total(),
                planned
            )
        })
    });
    let runs: Vec<RunView> = rows
        .iter()
        .map(|t| run_view(page, t, &anchors, &next, &rendered, forks))
        .collect();
    let omitted_runs = counts.total().saturating_sub(runs.len() as u64);

    // The last messages of the history; the earlier ones are counted.
    let history: &[serde_json::Value] = plan
        .and_then(|p| p.history.as_deref())
        .map_or(&[], Vec::as_slice);
    let history_more = history.len().saturating_sub(MAX_HISTORY_SHOWN);
    ScenarioView {
        anchor: anchors.scenario.clone(),
        suite: suite.to_owned(),
        id: scenario.to_owned(),
        name: plan.and_then(|p| p.name.clone()),
        description: plan.and_then(|p| p.description.clone()),
        persona: plan.and_then(|p| p.persona.as_ref()).map(persona_view),
        user_context: plan
            .map(|p| {
                p.user_context
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: k.clone(),
                        value: match v {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default(),
        row: plan
            .and_then(|p| p.instance.as_ref()?.row.as_deref())
            .map(|fields| {
                fields
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: k.clone(),
                        value: clipped(&match v {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        }),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        row_of: plan.and_then(|p| p.instance.as_ref()).and_then(|i| {
            match (&i.dataset, &i.row_id) {
                (Some(d), Some(id)) => Some(format!("dataset {d}, row id {id}")),
                (Some(d), None) => Some(format!("dataset {d}")),
                _ => None,
            }
        }),
        history: history
            .get(history_more..)
            .unwrap_or_default()
            .iter()
            .map(|m| KeyValue {
                key: m
                    .get("role")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("?")
                    .to_owned(),
                value: clipped(&history_text(m)),
            })
            .collect(),
        history_more: history_more as u64,
        agents: anchors.agents.clone(),
        tags: rows.first().map(|t| distinct(&t.tags)).unwrap_or_default(),
        repeat: plan.map_or(1, |p| p.repeat),
        counts: CountsView::of(&counts),
        trend: trends
            .get(&(suite.to_owned(), scenario.to_owned()))
            .and_then(|trend| {
                trend_view(
                    &trend.points,
                    TrendPoint {
                        run_id: page.info.run_id.clone(),
                        started_at: page.info.started_at.clone(),
                        passed: counts.passed,
                        ran: counts.passed + counts.failed + counts.errors,
                    },
                )
            }),
        coverage,
        tree,
        unrun,
        runs,
        omitted_runs,
    }
}

fn persona_view(persona: &serde_json::Value) -> PersonaView {
    let field = |name: &str| {
        persona
            .get(name)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    PersonaView {
        id: field("id"),
        kind: field("type"),
        description: field("description"),
        instructions: field("instructions"),
    }
}

/// A run whose transcript the report renders, and where it went wrong.
struct RenderedRun<'a> {
    trajectory: &'a str,
    agent: &'a str,
    repetition: u32,
    failed_at: Option<String>,
    /// The nodes its transcript shows: those it reached (a fault ends a run early).
    nodes: &'a [String],
}

/// The repetitions of one trajectory, grouped by agent: every repetition as a chip up to
/// [`MAX_CHIPS`], past that only those that did not pass (that many at most) and the rest
/// counted.
fn leaf_view(
    outline: &ScenarioOutline,
    trajectory: &str,
    anchors: &Anchors,
    rendered: &HashSet<(&str, &str, u32)>,
) -> Leaf {
    let mut runs: Vec<_> = outline.runs_of(trajectory).iter().collect();
    runs.sort_by_key(|(agent, _)| rank(&anchors.agents, agent));
    let mut agents: Vec<AgentReps> = Vec::new();
    for (agent, reps) in runs {
        let total = usize::try_from(reps.total).unwrap_or(usize::MAX);
        let drawn = if total > MAX_CHIPS {
            &reps.first_not_passed
        } else {
            &reps.first
        };
        let chips: Vec<Chip> = drawn
            .iter()
            .map(|(&repetition, status)| {
                let status = status.as_str();
                let anchor = rendered
                    .contains(&(trajectory, &**agent, repetition))
                    .then(|| anchors.run(trajectory, agent, repetition));
                Chip {
                    label: format!("#{repetition}"),
                    status,
                    anchor,
                    title: format!(
                        "{} · {agent} · repetition {repetition}: {status}",
                        trajectory_label(trajectory),
                    ),
                }
            })
            .collect();
        agents.push(AgentReps {
            agent: agent.to_string(),
            more: total.saturating_sub(chips.len()),
            more_passed: total > MAX_CHIPS
                && usize::try_from(reps.not_passed).is_ok_and(|n| n <= MAX_CHIPS),
            chips,
            passed: reps.passed,
            ran: reps.ran,
            grade: "na",
            estimate: None,
        });
    }
    for a in &mut agents {
        a.estimate = Estimate::of(a.passed, a.ran);
        a.grade = match (a.ran, a.passed) {
            (0, _) => "na",
            (_, 0) => "none",
            (ran, passed) if ran == passed => "all",
            _ => "some",
        };
    }
    Leaf {
        trajectory: trajectory_label(trajectory),
        show_agents: anchors.agents.len() > 1,
        agents,
        note: None,
    }
}

fn tree_view(
    outline: &ScenarioOutline,
    paths: &[(&String, &Vec<String>)],
    anchors: &Anchors,
    rendered: &HashSet<(&str, &str, u32)>,
    rendered_runs: &[RenderedRun<'_>],
    forks: bool,
) -> Vec<TreeNode> {
    let outcomes = node_outcomes(outline);
    // Parent of each node, and children in order of first appearance.
    let mut children: HashMap<Option<&str>, Vec<&str>> = HashMap::new();
    for (_, path) in paths {
        let mut parent: Option<&str> = None;
        for node in path.iter() {
            let list = children.entry(parent).or_default();
            if !list.contains(&node.as_str()) {
                list.push(node.as_str());
            }
            parent = Some(node.as_str());
        }
    }
    // The transcript a node links to: a run that went wrong there, else any run through it;
    // the first such in the order of the paths, then of agents and repetitions. Found for
    // every node at once from the paths that have rendered runs: a scenario of 100,000
    // trajectories has some 220,000 nodes, and a scan of every path for each node took
    // hours.
    let mut runs_of: HashMap<&str, Vec<&RenderedRun<'_>>> = HashMap::new();
    for run in rendered_runs {
        runs_of.entry(run.trajectory).or_default().push(run);
    }
    for runs in runs_of.values_mut() {
        runs.sort_by_key(|r| (rank(&anchors.agents, r.agent), r.repetition));
    }
    // node → (a run that went wrong there, the first run through it)
    let mut links: HashMap<&str, (Option<String>, Option<String>)> = HashMap::new();
    for (name, path) in paths {
        let Some(runs) = runs_of.get(name.as_str()) else {
            continue;
        };
        for run in runs {
            let at = anchors.run(name, run.agent, run.repetition);
            // Only the nodes it reached: its transcript has no place for the others.
            for node in path.iter().filter(|node| run.nodes.contains(node)) {
                let (failed, first) = links.entry(node.as_str()).or_default();
                if failed.is_none() && run.failed_at.as_deref() == Some(node.as_str()) {
                    *failed = Some(anchors.node(&at, node));
                }
                if first.is_none() {
                    *first = Some(anchors.node(&at, node));
                }
            }
        }
    }
    let link_for = |node: &str| -> Option<String> {
        let (failed, first) = links.get(node)?;
        failed.clone().or_else(|| first.clone())
    };
    // The paths that end at each node, in order.
    let mut ending: HashMap<&str, Vec<&str>> = HashMap::new();
    for (name, path) in paths {
        if let Some(last) = path.last() {
            ending.entry(last.as_str()).or_default().push(name.as_str());
        }
    }
    fn build(
        parent: Option<&str>,
        children: &HashMap<Option<&str>, Vec<&str>>,
        outcomes: &HashMap<&str, NodeOutcome>,
        ending: &HashMap<&str, Vec<&str>>,
        leaf: &dyn Fn(&str) -> Leaf,
        link_for: &dyn Fn(&str) -> Option<String>,
        forks: bool,
    ) -> Vec<TreeNode> {
        children
            .get(&parent)
            .into_iter()
            .flatten()
            .map(|&node| {
                let outcome = outcomes.get(node).copied().unwrap_or_default();
                let passed = outcome.passed();
                let grade = match (outcome.reached, passed) {
                    (0, _) => "na",
                    (_, 0) => "none",
                    (reached, passed) if reached == passed => "all",
                    _ => "some",
                };
                TreeNode {
                    id: node.to_owned(),
                    label: node_label(node, forks),
                    anchor: link_for(node),
                    reached: outcome.reached,
                    passed,
                    failed_here: outcome.failed_here,
                    errors_here: outcome.errors_here,
                    failed_above: outcome.failed_above,
                    rate: percent(passed, outcome.reached),
                    grade,
                    ends: ending
                        .get(node)
                        .into_iter()
                        .flatten()
                        .map(|name| leaf(name))
                        .collect(),
                    children: build(
                        Some(node),
                        children,
                        outcomes,
                        ending,
                        leaf,
                        link_for,
                        forks,
                    ),
                }
            })
            .collect()
    }
    let leaf = |name: &str| leaf_view(outline, name, anchors, rendered);
    build(None, &children, &outcomes, &ending, &leaf, &link_for, forks)
}

/// Per node, the nodes that follow it on some path, in the order of the paths, each with
/// the first path through it: a transcript's links to the other branches of a fork.
type NextNodes<'a> = HashMap<&'a str, Vec<(&'a str, &'a str)>>;

fn next_nodes<'a>(paths: &[(&'a String, &'a Vec<String>)]) -> NextNodes<'a> {
    let mut next: NextNodes<'a> = HashMap::new();
    for (name, path) in paths {
        for pair in path.windows(2) {
            let [parent, child] = pair else { continue };
            let after = next.entry(parent.as_str()).or_default();
            if !after.iter().any(|(c, _)| *c == child.as_str()) {
                after.push((child.as_str(), name.as_str()));
            }
        }
    }
    next
}

fn run_view(
    page: &Page<'_>,
    t: &TrajectoryRecord,
    anchors: &Anchors,
    next: &NextNodes<'_>,
    rendered: &HashSet<(&str, &str, u32)>,
    forks: bool,
) -> RunView {
    let anchor = anchors.run(&t.trajectory, &t.agent, t.repetition);
    // Which node of this run took each turn, for "turn 3, after the fork «x»".
    let mut turn_nodes: HashMap<u32, String> = HashMap::new();
    for node in &t.nodes {
        if let Some(record) = page
            .nodes
            .get(&NodeKey::of(t, node))
            .and_then(|s| s.record.as_ref())
        {
            for turn in record.turns.iter().filter(|turn| !turn.replay) {
                turn_nodes.insert(turn.turn_index, node.clone());
            }
        }
    }
    let place = |turn: u32| {
        turn_nodes
            .get(&turn)
            .and_then(|node| node_place(node, forks))
    };
    let checks = |listed: fn(CriterionStatus) -> bool| -> Vec<CheckView> {
        t.criteria
            .iter()
            .filter(|c| listed(c.status))
            .map(|c| check_view(c, &place))
            .collect()
    };
    // A check whose evaluator failed (a judge that gave no verdict) is listed with the
    // failures: it is what makes its trajectory `error`.
    let failed_checks = checks(CriterionStatus::is_failure);
    let skipped_checks = checks(|s| s == CriterionStatus::Skipped);
    let headline = if let Some(fault) = &t.fault {
        Some(Headline {
            what: format!("fault · {}", fault.category.as_str()),
            why: Some(Text::new(&fault.message)),
        })
    } else if let Some(first) = t
        .criteria
        .iter()
        .find(|c| c.status == CriterionStatus::Error)
        .or_else(|| {
            t.criteria
                .iter()
                .find(|c| c.status == CriterionStatus::Failed)
        })
    {
        let where_ = first
            .turn_index
            .map(|i| match place(i) {
                Some(p) => format!(" (turn {i}, {p})"),
                None => format!(" (turn {i})"),
            })
            .unwrap_or_default();
        let error = if first.status == CriterionStatus::Error {
            "check error · "
        } else {
            ""
        };
        Some(Headline {
            what: format!("{error}{}{where_}", first.criterion),
            why: first.detail.as_deref().map(Text::new),
        })
    } else {
        t.skip_reason.as_deref().map(|reason| Headline {
            what: "skipped".to_owned(),
            why: Some(Text::new(reason)),
        })
    };
    let passed = t.checks_with(CriterionStatus::Passed) as u64;
    let failed = t.checks_with(CriterionStatus::Failed) as u64;
    let errors = t.checks_with(CriterionStatus::Error) as u64;
    let not_run = t.checks_with(CriterionStatus::Skipped) as u64;
    let check_summary = if t.criteria.is_empty() {
        "no checks".to_owned()
    } else {
        let mut parts = vec![format!("{passed} passed")];
        if failed > 0 {
            parts.push(format!("{failed} failed"));
        }
        if errors > 0 {
            parts.push(count(errors, "error", "errors"));
        }
        if not_run > 0 {
            parts.push(format!("{not_run} not run"));
        }
        format!(
            "{}: {}",
            count(t.criteria.len() as u64, "check", "checks"),
            parts.join(", ")
        )
    };

    let any_record = t.nodes.iter().any(|n| {
        page.nodes
            .get(&NodeKey::of(t, n))
            .is_some_and(|s| s.record.is_some())
    });
    let (transcript, transcript_note) = if let Some(why) = page.transcripts_missing {
        (
            Vec::new(),
            Some(format!("Transcript not available: {why}.")),
        )
    } else if t.nodes.is_empty() || (t.status == TrajectoryStatus::Skipped && !any_record) {
        // A skipped trajectory usually never ran: listing its nodes as missing would
        // suggest a crash that did not happen.
        (Vec::new(), None)
    } else {
        (
            transcript(page, t, &anchor, anchors, next, rendered, forks),
            None,
        )
    };

    RunView {
        anchor,
        status: t.status.as_str(),
        suite: t.suite.clone(),
        trajectory: trajectory_label(&t.trajectory),
        agent: t.agent.clone(),
        repetition: t.repetition,
        protocol: t.protocol.clone(),
        turns: count(u64::from(t.turns), "turn", "turns"),
        duration: ms(t.duration_ms),
        tags: distinct(&t.tags),
        headline,
        checks_not_run: not_run,
        check_summary,
        fault: t.fault.as_ref().map(FaultView::of),
        skip_reason: t.skip_reason.clone(),
        captures: t
            .captures
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        agent_forks: t
            .agent_branches
            .iter()
            .map(|b| {
                let mut text = format!(
                    "«{}»: alternative {} of {}{}",
                    b.option,
                    b.index,
                    b.count,
                    b.reason
                        .as_deref()
                        .map(|r| format!(" — the agent's reason: {r}"))
                        .unwrap_or_default()
                );
                if !b.unexplored.is_empty() {
                    text.push_str(&format!(
                        "; not explored: {}",
                        b.unexplored
                            .iter()
                            .map(|u| format!("«{u}»"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                if let Some(limit) = &b.limited_by {
                    text.push_str(&format!(" ({limit})"));
                }
                text
            })
            .collect(),
        awaiting_human: t.awaiting_human.clone(),
        sandbox_state: t
            .sandbox_state
            .as_ref()
            .and_then(|state| serde_json::to_string_pretty(state).ok()),
        failed_checks,
        skipped_checks,
        all_checks: checks(|_| true),
        transcript,
        transcript_note,
        open: false,
    }
}

fn transcript(
    page: &Page<'_>,
    t: &TrajectoryRecord,
    run_anchor: &str,
    anchors: &Anchors,
    next: &NextNodes<'_>,
    rendered: &HashSet<(&str, &str, u32)>,
    forks: bool,
) -> Vec<NodeBlock> {
    let mut blocks = Vec::new();
    let mut parent: Option<&str> = None;
    for node in &t.nodes {
        let slot = page.nodes.get(&NodeKey::of(t, node));
        // Other branches from the same fork, in this agent's same repetition: those shown
        // in the page first (they link), at most MAX_SIBLING_LINKS, the rest counted.
        let mut siblings = Vec::new();
        let mut more_siblings = 0;
        if let Some(parent) = parent {
            let mut unshown = Vec::new();
            for &(other, name) in next.get(parent).into_iter().flatten() {
                if other == node {
                    continue;
                }
                if rendered.contains(&(name, t.agent.as_str(), t.repetition)) {
                    if siblings.len() < MAX_SIBLING_LINKS {
                        siblings.push(Link {
                            label: node_label(other, forks),
                            anchor: Some(
                                anchors.node(&anchors.run(name, &t.agent, t.repetition), other),
                            ),
                        });
                    } else {
                        more_siblings += 1;
                    }
                } else if unshown.len() < MAX_SIBLING_LINKS {
                    unshown.push(other);
                } else {
                    more_siblings += 1;
                }
            }
            for other in unshown {
                if siblings.len() < MAX_SIBLING_LINKS {
                    siblings.push(Link {
                        label: node_label(other, forks),
                        anchor: None,
                    });
                } else {
                    more_siblings += 1;
                }
            }
        }
        let turns = slot
            .and_then(|s| s.record.as_ref())
            .map(|record| {
                record
                    .turns
                    .iter()
                    .map(|turn| turn_view(turn, &t.criteria, node_place(node, forks)))
                    .collect()
            })
            .unwrap_or_default();
        blocks.push(NodeBlock {
            anchor: anchors.node(run_anchor, node),
            id: node.clone(),
            label: node_label(node, forks),
            shared_by: slot.map_or(0, |s| s.trajectories),
            siblings,
            more_siblings,
            turns,
            missing: slot.and_then(|s| s.record.as_ref()).is_none().then_some(
                if page.watch_rerun && page.finished.is_some_and(|f| !f.interrupted) {
                    // A finished watch rerun records only the turns that called the agent:
                    // a node without a record was reused (in a stopped one, it may have
                    // been cut off).
                    "reused from an earlier rerun: its turns are in latest/report.html beside \
                     this rerun's directory"
                } else {
                    "no record of this node in the journal (the run may have stopped before it \
                     finished)"
                },
            ),
        });
        parent = Some(node.as_str());
    }
    blocks
}

fn turn_view(turn: &TurnRecord, criteria: &[CriterionRecord], place: Option<String>) -> TurnView {
    let mut meta = vec![
        format!("+{}", ms(turn.started_ms)),
        format!("latency {}", ms(turn.latency_ms)),
    ];
    if let Some(ttft) = turn.ttft_ms {
        meta.push(format!("ttft {}", ms(ttft)));
    }
    if turn.prompt_tokens.is_some() || turn.completion_tokens.is_some() {
        let n = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
        let mut tokens = format!(
            "tokens {} in / {} out",
            n(turn.prompt_tokens),
            n(turn.completion_tokens)
        );
        if let Some(total) = turn.total_tokens {
            tokens.push_str(&format!(" ({total} total)"));
        }
        meta.push(tokens);
    } else if let Some(total) = turn.total_tokens {
        meta.push(format!("{total} tokens"));
    }
    if let Some(model) = &turn.model {
        meta.push(model.clone());
    }
    if let Some(provider) = &turn.provider {
        meta.push(provider.clone());
    }
    if turn.attempts > 1 {
        meta.push(format!("{} attempts", turn.attempts));
    }
    if let Some(metadata) = &turn.metadata {
        meta.push(format!(
            "metadata {}",
            metadata_line(metadata, METADATA_CHARS + 40)
        ));
    }
    // Who spoke first: the user, the agent (`opening`), a function call or a human answer.
    let opener = match (turn.kind.as_str(), &turn.function) {
        (_, Some(function)) => format!("call {function}"),
        (kind, None) => kind.to_owned(),
    };

    // The agent's messages in order, so intermediate text and tool calls interleave as they
    // happened; the final reply is shown last, on its own.
    let mut items = Vec::new();
    let final_index = turn
        .messages
        .iter()
        .rposition(|m| m.role == "assistant" && m.content.is_some() && m.content == turn.reply);
    let mut shown_calls: HashSet<&str> = HashSet::new();
    for (i, message) in turn.messages.iter().enumerate() {
        match message.role.as_str() {
            "assistant" => {
                if Some(i) != final_index
                    && let Some(text) = message.content.as_deref().filter(|t| !t.is_empty())
                {
                    items.push(Item::Intermediate {
                        text: Text::new(text),
                    });
                }
                for call in &message.tool_calls {
                    let record = turn.tool_calls.iter().find(|r| r.call_id == call.id);
                    if record.is_some() {
                        shown_calls.insert(call.id.as_str());
                    }
                    items.push(Item::ToolCall {
                        name: call.function.name.clone(),
                        id: call.id.clone(),
                        arguments: Text::new(&pretty_json(&call.function.arguments)),
                        result: record
                            .and_then(|r| r.result.as_deref())
                            .map(|r| Text::new(&pretty_json(r))),
                    });
                }
            }
            "tool" => {
                let answered = message
                    .tool_call_id
                    .as_deref()
                    .is_some_and(|id| shown_calls.contains(id));
                if !answered && let Some(content) = &message.content {
                    items.push(Item::ToolResult {
                        id: message.tool_call_id.clone().unwrap_or_default(),
                        text: Text::new(&pretty_json(content)),
                    });
                }
            }
            other => {
                if let Some(text) = message.content.as_deref().filter(|t| !t.is_empty()) {
                    items.push(Item::Message {
                        role: other.to_owned(),
                        text: Text::new(text),
                    });
                }
            }
        }
        // Content that is not text (AgentScope data and images, Fixie embeds), as JSON
        // text: an image URL is shown, never loaded.
        for part in &message.parts {
            items.push(Item::Part {
                role: message.role.clone(),
                part_type: part
                    .get("type")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                text: Text::new(&part_text(part)),
            });
        }
    }
    // Tool calls the protocol reported without the messages that carried them.
    for record in &turn.tool_calls {
        if !shown_calls.contains(record.call_id.as_str())
            && !turn
                .messages
                .iter()
                .flat_map(|m| &m.tool_calls)
                .any(|c| c.id == record.call_id)
        {
            items.push(Item::ToolCall {
                name: record.name.clone(),
                id: record.call_id.clone(),
                arguments: Text::new(&pretty_json(&record.arguments)),
                result: record.result.as_deref().map(|r| Text::new(&pretty_json(r))),
            });
        }
    }
    let (spans, spans_hidden) = span_bars(&turn.spans);
    TurnView {
        spans,
        spans_hidden,
        label: format!("turn {}", turn.turn_index),
        place,
        meta,
        replay: turn.replay,
        opener,
        user: Text::new(&turn.user_message),
        items,
        reply: turn.reply.as_deref().map(Text::new),
        fault: turn.fault.as_ref().map(FaultView::of),
        // A replay's checks were judged on the original turn.
        checks: if turn.replay {
            Vec::new()
        } else {
            criteria
                .iter()
                .filter(|c| c.turn_index == Some(turn.turn_index))
                .map(|c| CheckView {
                    // Shown under its turn: the place would only repeat the turn's heading.
                    place: None,
                    ..check_view(c, &|_| None)
                })
                .collect()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_past_its_text_budget_shows_short_texts() {
        TEXT_BUDGET.with(|b| b.set(PAGE_TEXT_BUDGET));
        let big = "x".repeat(MAX_TEXT_CHARS * 2);
        let mut shown = 0;
        while TEXT_BUDGET.with(std::cell::Cell::get) > 0 {
            let t = Text::new(&big);
            assert!(t.text.len() <= MAX_TEXT_CHARS);
            shown += t.text.len();
        }
        assert_eq!(shown, PAGE_TEXT_BUDGET);
        let t = Text::new(&big);
        assert_eq!(t.text.len(), MAX_TEXT_CHARS_PAST_BUDGET);
        assert_eq!(t.cut, big.len() - MAX_TEXT_CHARS_PAST_BUDGET);
        TEXT_BUDGET.with(|b| b.set(PAGE_TEXT_BUDGET));
    }

    /// A turn's agent metadata is kept as its line, clipped once: a string the agent sent
    /// is clipped as its JSON would be, and the page shows the kept line whole.
    #[test]
    fn agent_metadata_is_kept_as_one_clipped_line() {
        for sent in [
            serde_json::json!("x".repeat(5_000)),
            serde_json::json!({ "trace": "y".repeat(5_000) }),
        ] {
            let mut record = NodeRecord {
                suite: "s".into(),
                scenario: "c".into(),
                agent: "a".into(),
                repetition: 0,
                node: "start".into(),
                parent: None,
                turns: vec![std::sync::Arc::new(TurnRecord {
                    metadata: Some(sent),
                    ..Default::default()
                })],
            };
            keep_for_page(&mut record);
            let kept = record.turns[0].metadata.clone().unwrap_or_default();
            let line = kept.as_str().unwrap_or_default();
            assert!(line.chars().count() < METADATA_CHARS + 40, "{line}");
            assert!(line.ends_with(" more characters)"), "{line}");
            let view = turn_view(&record.turns[0], &[], None);
            let shown = view
                .meta
                .iter()
                .find(|m| m.starts_with("metadata "))
                .unwrap();
            assert_eq!(shown, &format!("metadata {line}"));
        }
    }

    /// A transcript's record is kept at what the page can show of it, and the page still
    /// says how much of each text it left out.
    #[test]
    fn records_kept_for_the_page_hold_what_it_shows_and_count_the_rest() {
        let long = "é".repeat(3 * MAX_TEXT_CHARS);
        let turn = TurnRecord {
            user_message: long.clone(),
            reply: Some(long.clone()),
            messages: vec![trellis_records::ChatMessage {
                role: "assistant".into(),
                content: Some(long.clone()),
                parts: vec![
                    serde_json::json!({ "type": "data", "data": long.clone() }),
                    serde_json::json!({ "type": "image", "url": "https://x/y.png" }),
                ],
                ..Default::default()
            }],
            data: Some(serde_json::json!({ "big": long.clone() })),
            ..Default::default()
        };
        let node = |turn: TurnRecord| NodeRecord {
            suite: "s".into(),
            scenario: "c".into(),
            agent: "a".into(),
            repetition: 0,
            node: "start".into(),
            parent: None,
            turns: vec![std::sync::Arc::new(turn)],
        };
        let mut record = node(turn);
        keep_for_page(&mut record);
        let kept = &record.turns[0];
        let reply = kept.reply.as_deref().unwrap_or_default();
        assert!(reply.len() < 2 * MAX_TEXT_CHARS + 64, "{}", reply.len());
        assert_eq!(kept.messages[0].content.as_deref(), Some(reply));
        assert!(kept.data.is_none());
        let part = part_text(&kept.messages[0].parts[0]);
        assert!(part.starts_with("{\n  \"data\": \"éé"), "{part:.40}");
        assert_eq!(kept.messages[0].parts[0]["type"], "data");
        assert_eq!(
            kept.messages[0].parts[1],
            serde_json::json!({ "type": "image", "url": "https://x/y.png" })
        );
        TEXT_BUDGET.with(|b| b.set(PAGE_TEXT_BUDGET));
        let shown = Text::new(reply);
        assert_eq!(shown.text, "é".repeat(MAX_TEXT_CHARS));
        assert_eq!(shown.cut, 2 * MAX_TEXT_CHARS);
        // Past the page's budget, the count is of the whole text still.
        TEXT_BUDGET.with(|b| b.set(0));
        let shown = Text::new(&kept.user_message);
        assert_eq!(shown.text.chars().count(), MAX_TEXT_CHARS_PAST_BUDGET);
        assert_eq!(shown.cut, 3 * MAX_TEXT_CHARS - MAX_TEXT_CHARS_PAST_BUDGET);
        // A text short enough is kept as it is, a marker-like ending included.
        let mut short = node(TurnRecord {
            reply: Some(format!("ok{KEPT_CUT}12")),
            ..Default::default()
        });
        keep_for_page(&mut short);
        TEXT_BUDGET.with(|b| b.set(PAGE_TEXT_BUDGET));
        let shown = Text::new(short.turns[0].reply.as_deref().unwrap_or_default());
        assert_eq!(
            (shown.text.as_str(), shown.cut),
            (format!("ok{KEPT_CUT}12").as_str(), 0)
        );
    }

    #[test]
    fn clips_on_character_boundaries() {
        assert_eq!(clip("héllo", 2), ("hé", 3));
        assert_eq!(clip("abc", 5), ("abc", 0));
    }

    #[test]
    fn node_ids_read_as_places_in_the_conversation() {
        assert_eq!(node_place("start", false), None);
        assert_eq!(
            node_place("start", true).as_deref(),
            Some("before the fork")
        );
        assert_eq!(
            node_place("asks-price", true).as_deref(),
            Some("after the fork «asks-price»")
        );
        assert_eq!(
            node_place("y/y1/then/then", true).as_deref(),
            Some("after «y1», where the branches rejoin")
        );
        assert_eq!(node_label("accepts/then", true), "after «accepts»");
        assert_eq!(node_label("start", false), "conversation");
        assert_eq!(node_label("start~refund", true), "agent's branch «refund»");
        assert_eq!(
            node_label("accepts~voucher~large", true),
            "branch «accepts» · agent's branch «voucher» › «large»"
        );
        assert_eq!(
            node_place("start~refund", true).as_deref(),
            Some("after the agent's fork «refund»")
        );
        assert_eq!(
            trajectory_label("main~refund"),
            "main → agent's branch «refund»"
        );
        assert_eq!(trajectory_label("y/y1"), "«y» → «y1»");
        // An attack search's forks are the attacker's, not the agent's.
        assert_eq!(
            trajectory_label("main~a1-2~a2-1"),
            "main → attack «a1-2» › «a2-1»"
        );
        assert_eq!(node_label("start~a1-3", true), "attack «a1-3»");
        assert_eq!(
            node_place("start~refund~a1-1", true).as_deref(),
            Some("after the agent's fork «refund» › the attacker's message «a1-1»")
        );
        assert!(!is_attack_label("a1"));
        assert!(!is_attack_label("area-51"));
    }
}
