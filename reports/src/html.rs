//! `report.html`: one self-contained page (inline CSS, JS and SVG; no external URL) for
//! people reading a run.
//!
//! Layout: a header with the run's totals, pass-rate tables per suite, scenario and agent,
//! then the selected trajectories, failures first, each with its failed criteria and its
//! full transcript grouped by execution node (shared prefixes marked as such). Every piece of
//! text that came from a suite, a user or an agent goes through [`Esc`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use trellis_engine::record::{
    CriterionRecord, CriterionStatus, Fault, RunInfo, RunSummary, TrajectoryRecord,
    TrajectoryStatus, TurnRecord,
};

use crate::error::ReportError;
use crate::staged::Staged;
use crate::tally::{Counts, Rendered, Tally};
use crate::{NodeKey, NodeSlot};

/// Longest text block rendered, in characters; the rest is in the Parquet tables.
const MAX_TEXT_CHARS: usize = 20_000;

/// Everything the page shows.
pub(crate) struct Page<'a> {
    pub(crate) info: &'a RunInfo,
    pub(crate) finished: Option<&'a RunSummary>,
    pub(crate) tally: &'a Tally,
    pub(crate) rendered: &'a Rendered,
    pub(crate) nodes: &'a HashMap<NodeKey, NodeSlot>,
    pub(crate) skipped_lines: usize,
    /// Why no transcript could be rendered (the journal was lost), if so.
    pub(crate) transcripts_missing: Option<&'a str>,
}

/// Writes the page as `path.partial` and moves it into place once complete.
pub(crate) fn write(path: &Path, page: &Page<'_>) -> Result<(), ReportError> {
    let (staged, file) = Staged::create(path)?;
    let mut out = BufWriter::new(file);
    render(&mut out, page)
        .and_then(|()| out.flush())
        .map_err(|e| ReportError::io("write", path, e))?;
    drop(out);
    staged.publish().map(drop)
}

/// HTML-escapes text for element content and quoted attribute values.
pub(crate) struct Esc<'a>(pub(crate) &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            let (plain, tail) = rest.split_at(at);
            f.write_str(plain)?;
            let mut chars = tail.chars();
            let entity = match chars.next() {
                Some('&') => "&amp;",
                Some('<') => "&lt;",
                Some('>') => "&gt;",
                Some('"') => "&quot;",
                _ => "&#39;",
            };
            f.write_str(entity)?;
            rest = chars.as_str();
        }
        f.write_str(rest)
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

fn rate(counts: &Counts) -> String {
    counts
        .pass_rate()
        .map_or_else(|| "–".to_owned(), |r| format!("{:.1}%", r * 100.0))
}

const STYLE: &str = r#"
:root{--p:#2e9e4f;--f:#d23c3c;--e:#e8871e;--s:#9aa0a6;--bg:#f7f7f8;--fg:#1d1f23;--mut:#5f6368;--line:#dfe1e5}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1200px;margin:0 auto;padding:16px 24px 64px}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px}
code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#eef0f2;padding:1px 4px;border-radius:3px}
pre{font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;margin:4px 0;padding:6px 8px;background:#fff;border:1px solid var(--line);border-radius:4px}
.meta{color:var(--mut)}.warn{color:var(--f);font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid var(--line);border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:var(--mut);font-size:12px}
table{border-collapse:collapse;background:#fff;border:1px solid var(--line);width:100%}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:middle}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
svg.bar .p{fill:var(--p)}svg.bar .f{fill:var(--f)}svg.bar .e{fill:var(--e)}svg.bar .s{fill:var(--s)}svg.bar .z{fill:#e8eaed}
.badge{display:inline-block;min-width:56px;text-align:center;border-radius:10px;padding:0 8px;color:#fff;font-size:12px;font-weight:600}
.badge.passed{background:var(--p)}.badge.failed{background:var(--f)}.badge.error{background:var(--e)}.badge.skipped{background:var(--s)}
.filters{position:sticky;top:0;background:var(--bg);padding:8px 0;display:flex;gap:6px;flex-wrap:wrap;align-items:center;z-index:1}
.filters button{border:1px solid var(--line);background:#fff;border-radius:14px;padding:3px 12px;cursor:pointer}
.filters button.on{background:var(--fg);color:#fff}
.filters input{flex:1;min-width:200px;padding:5px 10px;border:1px solid var(--line);border-radius:14px}
.traj{background:#fff;border:1px solid var(--line);border-left:4px solid var(--s);border-radius:6px;margin:8px 0}
.traj.passed{border-left-color:var(--p)}.traj.failed{border-left-color:var(--f)}.traj.error{border-left-color:var(--e)}
.traj summary{padding:8px 12px;cursor:pointer}
.traj .body{padding:0 12px 12px}
ul.checks{margin:6px 0;padding-left:18px}ul.checks li{margin:2px 0}
.why{color:var(--f)}
.node{border-left:3px solid var(--line);margin:10px 0 10px 2px;padding-left:10px}
.node.shared{border-left:3px dashed #7b8cde;background:#f5f6fd}
.node-head{font-size:12px;font-weight:600;color:var(--mut);text-transform:uppercase;letter-spacing:.03em}
.node.shared .node-head{color:#3f51b5}
.turn{margin:8px 0 12px}
.turn-head{font-size:12px;color:var(--mut)}
.msg .role,.tool .role{font-size:11px;font-weight:600;color:var(--mut);text-transform:uppercase}
.msg.user pre{background:#eef5ff}.msg.final pre{background:#effaf1}.msg.mid pre{background:#fafafa;color:#444}
.tool{margin:4px 0 4px 16px}.tool pre{background:#fffaf0}
.fault{color:#fff;background:var(--e);padding:4px 8px;border-radius:4px;margin:4px 0}
.note{color:var(--mut);font-style:italic}
"#;

const SCRIPT: &str = r#"
(function(){
  var status='all', query='';
  var items=document.querySelectorAll('section.traj');
  function apply(){
    var shown=0;
    items.forEach(function(el){
      var ok=(status==='all'||el.getAttribute('data-status')===status)&&
        (query===''||el.textContent.toLowerCase().indexOf(query)>=0);
      el.style.display=ok?'':'none';
      if(ok){shown++;}
    });
    var c=document.getElementById('shown');
    if(c){c.textContent=shown+' shown';}
  }
  document.querySelectorAll('button[data-filter]').forEach(function(b){
    b.addEventListener('click',function(){
      status=b.getAttribute('data-filter');
      document.querySelectorAll('button[data-filter]').forEach(function(x){x.classList.toggle('on',x===b);});
      apply();
    });
  });
  var q=document.getElementById('q');
  if(q){q.addEventListener('input',function(){query=q.value.toLowerCase().trim();apply();});}
  apply();
})();
"#;

fn render(w: &mut impl Write, p: &Page<'_>) -> io::Result<()> {
    let info = p.info;
    let total = &p.tally.total;
    writeln!(
        w,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>Trellis run {}</title><style>{STYLE}</style></head><body><main>",
        Esc(&info.run_id)
    )?;

    // Header.
    write!(
        w,
        "<header><h1>Trellis run <code>{}</code></h1>",
        Esc(&info.run_id)
    )?;
    write!(w, "<p class=\"meta\">started {}", Esc(&info.started_at))?;
    match p.finished {
        Some(done) => {
            write!(
                w,
                " · finished {} · took {}",
                Esc(&done.finished_at),
                ms(done.duration_ms)
            )?;
            // A run stopped by Ctrl-C or SIGTERM ends its journal properly, but the
            // trajectories it never finished are missing: without this line its pass rate
            // reads like a complete run's.
            if total.total() < info.planned_trajectories {
                write!(
                    w,
                    " · <span class=\"warn\">stopped before its end: {} of {} planned \
                     trajectories are recorded here</span>",
                    total.total(),
                    info.planned_trajectories
                )?;
            }
        }
        None => write!(
            w,
            " · <span class=\"warn\">did not finish: the journal has no run_finished entry; \
             {} of {} planned trajectories are recorded here</span>",
            total.total(),
            info.planned_trajectories
        )?,
    }
    write!(w, " · trellis {}", Esc(&info.trellis_version))?;
    if !info.suites.is_empty() {
        let suites: Vec<String> = info.suites.iter().map(|s| Esc(s).to_string()).collect();
        write!(w, " · suites {}", suites.join(", "))?;
    }
    write!(w, "</p>")?;
    if p.skipped_lines > 0 {
        write!(
            w,
            "<p class=\"warn\">{} journal line(s) could not be read and were skipped.</p>",
            p.skipped_lines
        )?;
    }
    if let Some(why) = p.transcripts_missing {
        write!(
            w,
            "<p class=\"warn\">Transcripts are not shown: {}. Counts, checks and tables are \
             complete.</p>",
            Esc(why)
        )?;
    }
    if p.tally.checks_skipped > 0 {
        write!(
            w,
            "<p class=\"warn\">{} did not run, on {}: a trajectory \
             whose checks did not run is not evidence that the agent passes them (see \
             <code>--strict</code>).</p>",
            count(p.tally.checks_skipped, "check", "checks"),
            count(
                p.tally.trajectories_with_skipped_checks,
                "trajectory",
                "trajectories"
            )
        )?;
    }
    write!(w, "<div class=\"cards\">")?;
    write!(
        w,
        "<div class=\"card\"><b>{}</b><span>pass rate</span><br>",
        rate(total)
    )?;
    bar(w, total, 160)?;
    write!(w, "</div>")?;
    for (value, label) in [
        (total.total(), "trajectories"),
        (total.passed, "passed"),
        (total.failed, "failed"),
        (total.errors, "errors"),
        (total.skipped, "skipped"),
        (p.tally.checks_skipped, "checks not run"),
        (p.tally.turns, "agent turns"),
    ] {
        write!(
            w,
            "<div class=\"card\"><b>{value}</b><span>{label}</span></div>"
        )?;
    }
    writeln!(w, "</div></header>")?;
    writeln!(
        w,
        "<p class=\"meta\">Pass rate = passed / (passed + failed + errors); skipped \
         trajectories are left out.</p>"
    )?;

    // Pass-rate tables.
    rate_table(
        w,
        "By suite",
        "suite",
        p.tally.by_suite.iter().map(|(k, v)| (k.as_str(), None, v)),
    )?;
    rate_table(
        w,
        "By scenario",
        "scenario",
        p.tally
            .by_scenario
            .iter()
            .map(|((suite, scenario), v)| (scenario.as_str(), Some(suite.as_str()), v)),
    )?;
    rate_table(
        w,
        "By agent",
        "agent",
        p.tally.by_agent.iter().map(|(k, v)| (k.as_str(), None, v)),
    )?;

    // Trajectories.
    write!(w, "<h2>Trajectories</h2>\n<div class=\"filters\">")?;
    write!(
        w,
        "<button type=\"button\" data-filter=\"all\" class=\"on\">all ({})</button>",
        p.rendered.trajectories.len()
    )?;
    for status in [
        TrajectoryStatus::Error,
        TrajectoryStatus::Failed,
        TrajectoryStatus::Skipped,
        TrajectoryStatus::Passed,
    ] {
        let n = p
            .rendered
            .trajectories
            .iter()
            .filter(|t| t.status == status)
            .count();
        write!(
            w,
            "<button type=\"button\" data-filter=\"{0}\">{0} ({n})</button>",
            status.as_str()
        )?;
    }
    writeln!(
        w,
        "<input id=\"q\" type=\"search\" placeholder=\"filter by text: scenario, agent, \
         criterion, reply…\"><span id=\"shown\" class=\"meta\"></span></div>"
    )?;
    if p.rendered.omitted_failing > 0 || p.rendered.omitted_passing > 0 {
        writeln!(
            w,
            "<p class=\"note\">Not shown in full: {} non-passing and {} passing \
             trajectories (the page keeps to a readable size); every trajectory is in \
             trajectories.parquet and every turn in turns.parquet.</p>",
            p.rendered.omitted_failing, p.rendered.omitted_passing
        )?;
    }
    if p.rendered.trajectories.is_empty() {
        writeln!(
            w,
            "<p class=\"note\">No trajectory finished in this run.</p>"
        )?;
    }
    for (i, t) in p.rendered.trajectories.iter().enumerate() {
        trajectory(w, p, i, t)?;
    }
    writeln!(w, "</main><script>{SCRIPT}</script></body></html>")
}

/// A stacked pass/fail/error/skip bar.
fn bar(w: &mut impl Write, c: &Counts, width: u32) -> io::Result<()> {
    write!(
        w,
        "<svg class=\"bar\" width=\"{width}\" height=\"10\" viewBox=\"0 0 100 10\" \
         preserveAspectRatio=\"none\" role=\"img\" aria-label=\"{} passed, {} failed, {} \
         errors, {} skipped\"><rect class=\"z\" width=\"100\" height=\"10\"/>",
        c.passed, c.failed, c.errors, c.skipped
    )?;
    let total = c.total();
    if total > 0 {
        let mut x = 0.0;
        for (n, class) in [
            (c.passed, "p"),
            (c.failed, "f"),
            (c.errors, "e"),
            (c.skipped, "s"),
        ] {
            if n == 0 {
                continue;
            }
            let width = n as f64 * 100.0 / total as f64;
            write!(
                w,
                "<rect class=\"{class}\" x=\"{x:.3}\" width=\"{width:.3}\" height=\"10\"/>"
            )?;
            x += width;
        }
    }
    write!(w, "</svg>")
}

fn rate_table<'a>(
    w: &mut impl Write,
    title: &str,
    what: &str,
    rows: impl Iterator<Item = (&'a str, Option<&'a str>, &'a Counts)>,
) -> io::Result<()> {
    write!(
        w,
        "<h2>{title}</h2><table><thead><tr><th>{what}</th><th class=\"n\">trajectories</th>\
         <th class=\"n\">passed</th><th class=\"n\">failed</th><th class=\"n\">errors</th>\
         <th class=\"n\">skipped</th><th class=\"n\">pass rate</th><th></th></tr></thead><tbody>"
    )?;
    for (name, context, c) in rows {
        write!(w, "<tr><td>")?;
        if let Some(context) = context {
            write!(w, "<span class=\"meta\">{} / </span>", Esc(context))?;
        }
        write!(
            w,
            "{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>",
            Esc(name),
            c.total(),
            c.passed,
            c.failed,
            c.errors,
            c.skipped,
            rate(c)
        )?;
        bar(w, c, 160)?;
        write!(w, "</td></tr>")?;
    }
    writeln!(w, "</tbody></table>")
}

fn text_block(w: &mut impl Write, text: &str) -> io::Result<()> {
    let (shown, cut) = clip(text, MAX_TEXT_CHARS);
    write!(w, "<pre>{}", Esc(shown))?;
    if cut > 0 {
        write!(
            w,
            "<span class=\"note\">\n… {cut} more characters (see turns.parquet)</span>"
        )?;
    }
    write!(w, "</pre>")
}

/// JSON text pretty-printed when it parses, as sent otherwise.
fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_owned())
}

fn fault_line(w: &mut impl Write, fault: &Fault) -> io::Result<()> {
    write!(
        w,
        "<div class=\"fault\">fault · <b>{}</b>: {}</div>",
        fault.category.as_str(),
        Esc(&fault.message)
    )
}

fn criterion_item(w: &mut impl Write, c: &CriterionRecord) -> io::Result<()> {
    write!(
        w,
        "<li><span class=\"badge {0}\">{0}</span> <code>{1}</code> <span class=\"meta\">{2}",
        c.status.as_str(),
        Esc(&c.criterion),
        Esc(&c.kind)
    )?;
    if let Some(turn) = c.turn_index {
        write!(w, " · turn {turn}")?;
    }
    write!(w, "</span>")?;
    if let Some(detail) = &c.detail {
        let class = if c.status == CriterionStatus::Failed {
            "why"
        } else {
            "meta"
        };
        let (shown, cut) = clip(detail, MAX_TEXT_CHARS);
        write!(w, " — <span class=\"{class}\">{}", Esc(shown))?;
        if cut > 0 {
            write!(w, " … ({cut} more characters)")?;
        }
        write!(w, "</span>")?;
    }
    write!(w, "</li>")
}

fn trajectory(
    w: &mut impl Write,
    p: &Page<'_>,
    index: usize,
    t: &TrajectoryRecord,
) -> io::Result<()> {
    let status = t.status.as_str();
    let open = if t.status == TrajectoryStatus::Passed {
        ""
    } else {
        " open"
    };
    write!(
        w,
        "<section class=\"traj {status}\" data-status=\"{status}\" id=\"t{index}\"><details{open}>\
         <summary><span class=\"badge {status}\">{status}</span> <b>{}</b> / <b>{}</b> / \
         <b>{}</b> · agent <code>{}</code> #{} <span class=\"meta\">· {} · {} · {}</span>",
        Esc(&t.suite),
        Esc(&t.scenario),
        Esc(&t.trajectory),
        Esc(&t.agent),
        t.repetition,
        Esc(&t.protocol),
        count(u64::from(t.turns), "turn", "turns"),
        ms(t.duration_ms)
    )?;
    let not_run: Vec<&CriterionRecord> = t
        .criteria
        .iter()
        .filter(|c| c.status == CriterionStatus::Skipped)
        .collect();
    if !not_run.is_empty() {
        write!(
            w,
            " <span class=\"badge skipped\">{} not run</span>",
            count(not_run.len() as u64, "check", "checks")
        )?;
    }
    for tag in &t.tags {
        write!(w, " <code>#{}</code>", Esc(tag))?;
    }
    write!(w, "</summary><div class=\"body\">")?;

    if let Some(reason) = &t.skip_reason {
        write!(w, "<p class=\"why\">skipped: {}</p>", Esc(reason))?;
    }
    if let Some(fault) = &t.fault {
        fault_line(w, fault)?;
    }
    let failed: Vec<&CriterionRecord> = t
        .criteria
        .iter()
        .filter(|c| c.status == CriterionStatus::Failed)
        .collect();
    if !failed.is_empty() {
        write!(w, "<p><b>Failed criteria</b></p><ul class=\"checks\">")?;
        for c in &failed {
            criterion_item(w, c)?;
        }
        write!(w, "</ul>")?;
    }
    if !not_run.is_empty() {
        write!(
            w,
            "<p><b>Checks that did not run</b></p><ul class=\"checks\">"
        )?;
        for c in &not_run {
            criterion_item(w, c)?;
        }
        write!(w, "</ul>")?;
    }
    if !t.criteria.is_empty() {
        write!(
            w,
            "<details><summary class=\"meta\">{}</summary><ul class=\"checks\">",
            match t.criteria.len() {
                1 => "the 1 check".to_owned(),
                n => format!("all {n} checks"),
            }
        )?;
        for c in &t.criteria {
            criterion_item(w, c)?;
        }
        write!(w, "</ul></details>")?;
    }

    let any_record = t.nodes.iter().any(|n| {
        p.nodes
            .get(&NodeKey::of(t, n))
            .is_some_and(|s| s.record.is_some())
    });
    // A skipped trajectory usually never ran: listing its nodes as missing would suggest a
    // crash that did not happen.
    if t.nodes.is_empty()
        || (t.status == TrajectoryStatus::Skipped && !any_record)
        || p.transcripts_missing.is_some()
    {
        return writeln!(w, "</div></details></section>");
    }
    write!(w, "<p><b>Transcript</b></p>")?;
    for node in &t.nodes {
        let slot = p.nodes.get(&NodeKey::of(t, node));
        let shared_by = slot.map_or(0, |s| s.trajectories);
        if shared_by > 1 {
            write!(
                w,
                "<div class=\"node shared\"><div class=\"node-head\">shared prefix · node {} · \
                 shared by {shared_by} trajectories</div>",
                Esc(node)
            )?;
        } else {
            write!(
                w,
                "<div class=\"node\"><div class=\"node-head\">node {}</div>",
                Esc(node)
            )?;
        }
        match slot.and_then(|s| s.record.as_ref()) {
            Some(record) => {
                if record.turns.is_empty() {
                    write!(w, "<p class=\"note\">no agent turn in this node</p>")?;
                }
                for turn in &record.turns {
                    render_turn(w, turn, &t.criteria)?;
                }
            }
            None => write!(
                w,
                "<p class=\"note\">no record of this node in the journal (the run may have \
                 stopped before it finished)</p>"
            )?,
        }
        write!(w, "</div>")?;
    }
    writeln!(w, "</div></details></section>")
}

/// One agent turn; `criteria` are the trajectory's checks, of which those on this turn
/// (`expect`) are shown under it.
fn render_turn(
    w: &mut impl Write,
    turn: &TurnRecord,
    criteria: &[CriterionRecord],
) -> io::Result<()> {
    write!(
        w,
        "<div class=\"turn\"><div class=\"turn-head\">turn {} · +{} · latency {}",
        turn.turn_index,
        ms(turn.started_ms),
        ms(turn.latency_ms)
    )?;
    if let Some(ttft) = turn.ttft_ms {
        write!(w, " · ttft {}", ms(ttft))?;
    }
    if turn.prompt_tokens.is_some() || turn.completion_tokens.is_some() {
        let n = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
        write!(
            w,
            " · tokens {} in / {} out",
            n(turn.prompt_tokens),
            n(turn.completion_tokens)
        )?;
    }
    if let Some(total) = turn.total_tokens {
        write!(w, " ({total} total)")?;
    }
    if let Some(model) = &turn.model {
        write!(w, " · {}", Esc(model))?;
    }
    if let Some(provider) = &turn.provider {
        write!(w, " · {}", Esc(provider))?;
    }
    if turn.attempts > 1 {
        write!(w, " · {} attempts", turn.attempts)?;
    }
    if turn.replay {
        write!(
            w,
            " · <b>replay</b> of the shared prefix in this branch's own session (its checks \
             were judged on the original turn)"
        )?;
    }
    write!(w, "</div>")?;

    // Who spoke first: the user, the agent (`opening`), a function call or a human answer.
    let role = match (turn.kind.as_str(), &turn.function) {
        (_, Some(function)) => format!("call {}", Esc(function)),
        ("user", None) => "user".to_owned(),
        (kind, None) => Esc(kind).to_string(),
    };
    write!(
        w,
        "<div class=\"msg user\"><span class=\"role\">{role}</span>"
    )?;
    text_block(w, &turn.user_message)?;
    write!(w, "</div>")?;

    // Walk the agent's messages in order so intermediate text and tool calls interleave as
    // they happened; the final reply is shown last, on its own.
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
                    write!(
                        w,
                        "<div class=\"msg mid\"><span class=\"role\">assistant · \
                         intermediate</span>"
                    )?;
                    text_block(w, text)?;
                    write!(w, "</div>")?;
                }
                for call in &message.tool_calls {
                    let record = turn.tool_calls.iter().find(|r| r.call_id == call.id);
                    if record.is_some() {
                        shown_calls.insert(call.id.as_str());
                    }
                    tool_call(
                        w,
                        &call.function.name,
                        &call.id,
                        &call.function.arguments,
                        record.and_then(|r| r.result.as_deref()),
                    )?;
                }
            }
            "tool" => {
                let answered = message
                    .tool_call_id
                    .as_deref()
                    .is_some_and(|id| shown_calls.contains(id));
                if !answered && let Some(content) = &message.content {
                    write!(
                        w,
                        "<div class=\"tool\"><span class=\"role\">tool result {}</span>",
                        Esc(message.tool_call_id.as_deref().unwrap_or(""))
                    )?;
                    text_block(w, &pretty_json(content))?;
                    write!(w, "</div>")?;
                }
            }
            other => {
                if let Some(text) = message.content.as_deref().filter(|t| !t.is_empty()) {
                    write!(
                        w,
                        "<div class=\"msg mid\"><span class=\"role\">{}</span>",
                        Esc(other)
                    )?;
                    text_block(w, text)?;
                    write!(w, "</div>")?;
                }
            }
        }
        // Content that is not text (AgentScope data and images, Fixie embeds), as JSON text:
        // an image URL is shown, never loaded.
        for part in &message.parts {
            write!(
                w,
                "<div class=\"tool\"><span class=\"role\">{} · content part</span>",
                Esc(&message.role)
            )?;
            let json = serde_json::to_string_pretty(part).unwrap_or_default();
            text_block(w, &json)?;
            write!(w, "</div>")?;
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
            tool_call(
                w,
                &record.name,
                &record.call_id,
                &record.arguments,
                record.result.as_deref(),
            )?;
        }
    }

    match &turn.reply {
        Some(reply) => {
            write!(
                w,
                "<div class=\"msg final\"><span class=\"role\">assistant</span>"
            )?;
            text_block(w, reply)?;
            write!(w, "</div>")?;
        }
        None => write!(w, "<p class=\"note\">no reply</p>")?,
    }
    if let Some(fault) = &turn.fault {
        fault_line(w, fault)?;
    }
    let mut checks = criteria
        .iter()
        .filter(|c| c.turn_index == Some(turn.turn_index))
        .peekable();
    if checks.peek().is_some() {
        write!(w, "<ul class=\"checks\">")?;
        for c in checks {
            criterion_item(w, c)?;
        }
        write!(w, "</ul>")?;
    }
    write!(w, "</div>")
}

fn tool_call(
    w: &mut impl Write,
    name: &str,
    id: &str,
    arguments: &str,
    result: Option<&str>,
) -> io::Result<()> {
    write!(
        w,
        "<div class=\"tool\"><span class=\"role\">tool call · </span><code>{}</code> \
         <span class=\"meta\">{}</span>",
        Esc(name),
        Esc(id)
    )?;
    text_block(w, &pretty_json(arguments))?;
    match result {
        Some(result) => {
            write!(w, "<span class=\"role\">result</span>")?;
            text_block(w, &pretty_json(result))?;
        }
        None => write!(w, "<p class=\"note\">no result returned</p>")?,
    }
    write!(w, "</div>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            Esc("<script>alert('x') & \"y\"</script>").to_string(),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(Esc("héllo ✓").to_string(), "héllo ✓");
    }

    #[test]
    fn clips_on_character_boundaries() {
        assert_eq!(clip("héllo", 2), ("hé", 3));
        assert_eq!(clip("abc", 5), ("abc", 0));
    }
}
