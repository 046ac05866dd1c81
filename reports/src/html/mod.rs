//! `report.html`: one self-contained page (inline CSS, JS and SVG; no external URL, a strict
//! Content-Security-Policy) for people reading a run.
//!
//! The page is rendered from minijinja templates (`templates/`, embedded at build time) with
//! HTML auto-escaping on for every value: suite, user and agent text can never become markup.
//! [`view`] turns the run into plain serializable structs (labels, counts, clipped texts);
//! the templates only lay them out. The script does not build markup from text either: it
//! only shows, hides and opens elements the page already has. Nothing is embedded as JSON.

mod compare;
mod gate;
mod outline;
mod trend;
mod view;

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::OnceLock;

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use trellis_records::{RunInfo, RunSummary};

pub use compare::{
    CompareMetric, ComparePage, CompareRate, CompareRow, CompareRun, CompareTally, write_compare,
};
pub(crate) use gate::add_gate;
pub(crate) use outline::Outline;
pub(crate) use trend::TrendSource;
pub use trend::{ScenarioTrend, TrendPoint, Trends};
pub(crate) use view::keep_for_page;

use crate::error::ReportError;
use crate::staged::Staged;
use crate::tally::{Rendered, Tally};
use crate::{NodeKey, NodeSlot};

const PAGE_TEMPLATE: &str = include_str!("templates/report.html");
const MACROS_TEMPLATE: &str = include_str!("templates/macros.html");
const COMPARE_TEMPLATE: &str = include_str!("templates/compare.html");
const STYLE: &str = include_str!("templates/report.css");
const SCRIPT: &str = include_str!("templates/report.js");
const SCRIPT_COMPARE: &str = include_str!("templates/compare.js");

/// Everything the page shows.
pub(crate) struct Page<'a> {
    pub(crate) info: &'a RunInfo,
    pub(crate) finished: Option<&'a RunSummary>,
    pub(crate) tally: &'a Tally,
    pub(crate) outline: &'a Outline,
    /// Where the earlier runs per scenario come from: read only for the scenarios the page
    /// draws.
    pub(crate) trends: TrendSource<'a>,
    pub(crate) rendered: &'a Rendered,
    pub(crate) nodes: &'a HashMap<NodeKey, NodeSlot>,
    pub(crate) skipped_lines: usize,
    /// Why no transcript could be rendered (the journal was lost), if so.
    pub(crate) transcripts_missing: Option<&'a str>,
    /// `variance.json` of the run directory, if any.
    pub(crate) variance: Option<&'a crate::variance::VarianceReport>,
    /// What the run is a part or a combination of (a shard, a merge), said as a sentence.
    pub(crate) provenance: Option<&'a str>,
    /// The baseline run `compare.html`, next to the page, compares this one with.
    pub(crate) compared_with: Option<&'a str>,
    /// A `trellis watch` rerun's directory (`run.json`'s `watch_rerun`): it records only
    /// the turns that called the agent, so a node without a record was reused, not cut off.
    pub(crate) watch_rerun: bool,
}

/// Why the page could not be rendered: the I/O error its file met (a full disk, which the
/// template engine says as "I/O error during rendering"), else the template's error.
fn render_error(
    first: &std::sync::OnceLock<std::io::Error>,
    path: &Path,
    e: minijinja::Error,
) -> ReportError {
    match crate::staged::kept_io_error(first) {
        Some(io) => ReportError::io("write", path, io),
        None => ReportError::Template {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// Writes the page as `path.partial` and moves it into place once complete.
pub(crate) fn write(path: &Path, page: &Page<'_>) -> Result<(), ReportError> {
    let view = view::build(page);
    let (staged, file) = Staged::create(path)?;
    let first = std::sync::Arc::new(std::sync::OnceLock::new());
    let mut out = BufWriter::new(crate::staged::KeptIoError {
        file,
        first: first.clone(),
    });
    render_to(&view, &mut out).map_err(|e| render_error(&first, path, e))?;
    out.flush().map_err(|e| ReportError::io("write", path, e))?;
    drop(out);
    staged.publish().map(drop)
}

/// How the pages' Content-Security-Policy starts (`templates/report.html`): where
/// [`with_served_script`] adds what a served copy needs.
const POLICY_START: &str =
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src ";

/// A copy of a page this crate wrote, with one more script of the caller's that the page's
/// Content-Security-Policy allows: by its hash, and allowed to connect back to the origin
/// the page is served from (`connect-src 'self'`). `trellis watch --serve` adds its reload
/// script this way; the file on disk keeps the strict policy, which would block it.
///
/// The script goes before `</body>` (or at the end). `script` must not contain `</`.
pub fn with_served_script(page: &str, script: &str) -> String {
    let mut page = match page.find(POLICY_START) {
        Some(at) => {
            let sources = at + POLICY_START.len();
            let default_src = at + POLICY_START.find("script-src").unwrap_or(0);
            format!(
                "{}connect-src 'self'; {}'{}' {}",
                &page[..default_src],
                &page[default_src..sources],
                view::script_hash(script),
                &page[sources..]
            )
        }
        // Not one of ours (the server's own placeholder page): no policy to widen.
        None => page.to_owned(),
    };
    let tag = format!("<script>{script}</script>");
    match page.rfind("</body>") {
        Some(at) => page.insert_str(at, &tag),
        None => page.push_str(&tag),
    }
    page
}

/// The report page's templates (it imports the macros).
const PAGE_TEMPLATES: &[(&str, &str)] = &[
    ("macros.html", MACROS_TEMPLATE),
    ("report.html", PAGE_TEMPLATE),
];

/// The comparison page's template.
const COMPARE_TEMPLATES: &[(&str, &str)] = &[("compare.html", COMPARE_TEMPLATE)];

/// An environment with `templates` (name, source): HTML escaping for every template, and an
/// undefined value is an error rather than silently empty text. Only the templates a page
/// needs are compiled: compiling is most of what rendering a small run's page costs.
fn environment(
    templates: &[(&'static str, &'static str)],
) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.set_formatter(|out, state, value| {
        // Text an agent or an LLM wrote can hold NUL and other control characters (which
        // make the file "binary" to grep and show as nothing) and bidirectional overrides
        // (which reverse the rest of a row's text: an agent name, a repetition number).
        // They are shown as `\u{..}` escapes; our own safe strings (styles, script, JSON)
        // go out as they are.
        if !value.is_safe()
            && let Some(text) = value.as_str()
            && let std::borrow::Cow::Owned(visible) = trellis_records::shown::visible_controls(text)
        {
            return minijinja::escape_formatter(out, state, &Value::from(visible));
        }
        minijinja::escape_formatter(out, state, value)
    });
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    for &(name, source) in templates {
        env.add_template(name, source)?;
    }
    Ok(env)
}

/// The report page's environment, compiled once per process: compiling is most of what
/// writing a small run's page costs (about 3 M instructions, 44% of the pages' work at the end
/// of 2,000 trajectories), and `trellis watch` writes a page per rerun.
static PAGE_ENVIRONMENT: OnceLock<Result<Environment<'static>, minijinja::Error>> = OnceLock::new();

fn page_environment() -> Result<&'static Environment<'static>, minijinja::Error> {
    match PAGE_ENVIRONMENT.get_or_init(|| environment(PAGE_TEMPLATES)) {
        Ok(env) => Ok(env),
        // Our own templates, tested to compile (`templates_parse`): each page that needs
        // them says so again.
        Err(e) => Err(minijinja::Error::new(e.kind(), e.to_string())),
    }
}

/// Compiles the report page's templates now, if they are not yet: a recorder with nothing
/// to do while the run waits on its agents calls it, so that the end of the run, which
/// the user waits for, does not.
pub fn prepare() {
    let _ = page_environment();
}

fn render_to(view: &view::PageView, out: impl Write) -> Result<(), minijinja::Error> {
    let env = page_environment()?;
    let template = env.get_template("report.html")?;
    let context = minijinja::context! {
        page => Value::from(minijinja::value::Serde(view)),
        // Ours, constant, and free of `</`: safe to put inside <style> and <script> as is.
        style => Value::from_safe_string(STYLE.to_owned()),
        script => Value::from_safe_string(SCRIPT.to_owned()),
        script_hash => view::script_hash(SCRIPT),
    };
    template.render_captured_to(context, out).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_style_and_script_cannot_close_their_elements() {
        assert!(!STYLE.contains("</"));
        assert!(!SCRIPT.contains("</"));
        assert!(!SCRIPT_COMPARE.contains("</"));
    }

    #[test]
    fn a_served_script_is_allowed_by_the_policy_and_the_rest_kept() {
        let template = PAGE_TEMPLATE.replace("{{ script_hash }}", "sha256-OURS");
        let head = &template[template.find("<meta http-equiv").unwrap()..];
        let head = &head[..head.find('>').unwrap() + 1];
        let page = format!("{head}<body><p>x</p></body>");
        let served = with_served_script(&page, "go()");
        let hash = view::script_hash("go()");
        assert_eq!(
            served,
            format!(
                "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
                 connect-src 'self'; script-src '{hash}' 'sha256-OURS'; style-src 'unsafe-inline'; \
                 img-src data:; base-uri 'none'; form-action 'none'\"><body><p>x</p>\
                 <script>go()</script></body>"
            )
        );
        assert_eq!(
            with_served_script("bare", "go()"),
            "bare<script>go()</script>"
        );
    }

    #[test]
    fn templates_parse() {
        environment(PAGE_TEMPLATES).unwrap();
        environment(COMPARE_TEMPLATES).unwrap();
    }

    /// `prepare` leaves the page's templates compiled, and every page then renders with that
    /// one environment.
    #[test]
    fn prepared_templates_are_the_ones_pages_render_with() {
        prepare();
        let prepared = PAGE_ENVIRONMENT.get().unwrap().as_ref().unwrap();
        assert!(prepared.get_template("report.html").is_ok());
        assert!(std::ptr::eq(page_environment().unwrap(), prepared));
    }
}

#[cfg(test)]
mod render_error_tests {
    use std::io::Write as _;

    /// A full disk met while the page is rendered is said as one, not as the template
    /// engine's "I/O error during rendering".
    #[test]
    fn a_full_disk_under_the_page_is_said_as_one() {
        let first = std::sync::Arc::new(std::sync::OnceLock::new());
        let mut out = crate::staged::KeptIoError {
            file: std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .expect("/dev/full opens for writing"),
            first: first.clone(),
        };
        let written = out.write_all(&[b'x'; 64]);
        assert!(written.is_err());
        let e = minijinja::Error::new(
            minijinja::ErrorKind::WriteFailure,
            "I/O error during rendering",
        );
        let said = super::render_error(&first, std::path::Path::new("report.html"), e);
        let cause = std::error::Error::source(&said).map(ToString::to_string);
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.contains("No space left")),
            "{said}: {cause:?}"
        );
        let none = std::sync::OnceLock::new();
        let e = minijinja::Error::new(
            minijinja::ErrorKind::WriteFailure,
            "I/O error during rendering",
        );
        assert!(matches!(
            super::render_error(&none, std::path::Path::new("report.html"), e),
            crate::error::ReportError::Template { .. }
        ));
    }
}
