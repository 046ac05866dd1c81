//! The gate's verdict on `report.html`. The page is written before `run --baseline`
//! compares the run, so it can only say that a comparison follows; once the comparison is
//! made, its banner (`id="compared"`) is replaced by one stating the verdict and the first
//! regressions, so that a person who opens the page from a CI's artifacts sees whether the
//! run passed the gate. As with `junit.xml`, the file is copied through, not rendered again.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use minijinja::{AutoEscape, Environment, context};

use crate::error::ReportError;
use crate::staged::Staged;

/// Regressions listed on the page at most; the rest are counted (compare.html has them).
const LISTED: usize = 10;

/// The banner is in the page's header: it is looked for in this much of the file.
const HEAD: u64 = 1 << 20;

const BANNER_START: &str = "<div class=\"banner";
const BANNER_ID: &str = " id=\"compared\">";
const BANNER_END: &str = "</div><!-- /compared -->";

const TEMPLATE: &str = concat!(
    "<div class=\"banner {{ 'regressed' if regressed else 'ok' }}\" id=\"compared\"><b>",
    "{% if regressed %}The gate failed: {{ count }} regression{{ '' if count == 1 else 's' }}",
    "{% else %}The gate passed: no regression{% endif %}</b> against the baseline, run ",
    "<code>{{ baseline }}</code>. <a href=\"compare.html\">compare.html</a> has what changed.",
    "{% if listed %}<ul>{% for r in listed %}<li>{{ r }}</li>{% endfor %}</ul>",
    "{% if more %}And {{ more }} more.{% endif %}{% endif %}",
    "</div><!-- /compared -->",
);

/// Replaces the comparison banner of the `report.html` at `path` with the verdict. A page
/// without one (written with no baseline, or by another version) is left as it is.
pub(crate) fn add_gate(
    path: &Path,
    baseline: &str,
    regressed: bool,
    regressions: &[String],
) -> Result<(), ReportError> {
    let read_err = |e| ReportError::io("read", path, e);
    let file = File::open(path).map_err(read_err)?;
    let mut reader = BufReader::new(file);
    let mut head = Vec::new();
    (&mut reader)
        .take(HEAD)
        .read_to_end(&mut head)
        .map_err(read_err)?;
    let Some((start, end)) = banner(&head) else {
        return Ok(());
    };
    let banner = render(baseline, regressed, regressions)
        .map_err(|e| ReportError::io("write", path, io::Error::other(e.to_string())))?;
    let (staged, out) = Staged::create(path)?;
    let write_err = |e| ReportError::io("write", &staged.path, e);
    let mut out = io::BufWriter::new(out);
    out.write_all(&head[..start]).map_err(write_err)?;
    out.write_all(banner.as_bytes()).map_err(write_err)?;
    out.write_all(&head[end..]).map_err(write_err)?;
    io::copy(&mut reader, &mut out).map_err(write_err)?;
    out.flush().map_err(write_err)?;
    drop(out);
    staged.publish().map(drop)
}

/// The byte range of the comparison banner in the page's head.
fn banner(head: &[u8]) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(head).unwrap_or_else(|e| {
        // The head may end inside a character: what comes before it is text.
        std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default()
    });
    let id = text.find(BANNER_ID)?;
    let start = text[..id].rfind(BANNER_START)?;
    let end = id + text[id..].find(BANNER_END)? + BANNER_END.len();
    Some((start, end))
}

fn render(
    baseline: &str,
    regressed: bool,
    regressions: &[String],
) -> Result<String, minijinja::Error> {
    let mut env = Environment::new();
    // Debug mode (on in debug builds) changes what errors print: off, as in release.
    env.set_debug(false);
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.add_template("gate", TEMPLATE)?;
    let listed = &regressions[..regressions.len().min(LISTED)];
    env.get_template("gate")?.render(context! {
        regressed,
        count => regressions.len(),
        baseline,
        listed => listed.to_vec(),
        more => regressions.len() - listed.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_is_replaced_and_its_text_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.html");
        let page = format!(
            "<html><body><div class=\"banner note-banner\" id=\"compared\">Compared …</div>\
             <!-- /compared --><p>{}</p></body></html>",
            "x".repeat(3 << 20)
        );
        std::fs::write(&path, &page).unwrap();
        let regressions: Vec<String> = (0..12).map(|i| format!("<s{i}> regressed")).collect();
        add_gate(&path, "run <b>", true, &regressions).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("The gate failed: 12 regressions"),
            "{}",
            &text[..600]
        );
        assert!(
            text.contains("run <code>run &lt;b&gt;</code>"),
            "{}",
            &text[..600]
        );
        assert!(text.contains("<li>&lt;s9&gt; regressed</li>"));
        assert!(!text.contains("&lt;s10&gt;"), "ten listed");
        assert!(text.contains("And 2 more."));
        assert!(!text.contains("Compared …"));
        assert!(text.ends_with(&format!("{}</p></body></html>", "x".repeat(100))));
        assert_eq!(
            text.len() - text.find("<p>").unwrap(),
            page.len() - page.find("<p>").unwrap()
        );
        // Replaced again by a later comparison (a resumed run), not added to.
        add_gate(&path, "base", false, &[]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("id=\"compared\"").count(), 1);
        assert!(text.contains("The gate passed: no regression"));
        assert!(!text.contains("12 regressions"));
    }

    #[test]
    fn a_page_without_the_banner_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.html");
        std::fs::write(&path, "<html><p>no baseline</p></html>").unwrap();
        add_gate(&path, "base", true, &["r".into()]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "<html><p>no baseline</p></html>"
        );
    }
}
