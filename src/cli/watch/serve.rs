//! `trellis watch --serve`: the latest rerun's `report.html` on 127.0.0.1, and a
//! server-sent event stream that tells the open tab to reload after each rerun.
//!
//! The reload script is added to the page as it is served, and the page's
//! Content-Security-Policy widened to allow it (by hash) and its connection to `/events`;
//! the report file on disk stays exactly what `trellis run` writes.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use tokio::sync::broadcast;

/// Reloads the page when the server says a new report is out, and reconnects on its own
/// (EventSource does) if watch restarts. Added by [`trellis_reports::with_served_script`],
/// which lets the report's Content-Security-Policy run it.
const RELOAD_SCRIPT: &str = r#"(function(){var s=new EventSource("/events");s.addEventListener("reload",function(){location.reload();});})();"#;

const WAITING: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><title>trellis \
                       watch</title></head><body><p>Waiting for the first run to finish…</p>\
                       </body></html>";

#[derive(Clone)]
struct Shared {
    latest: Arc<Mutex<Option<PathBuf>>>,
    /// Why the last save cannot run (its diagnostics, as the console printed them): shown
    /// above the last good report, which the tab otherwise kept showing as if current.
    invalid: Arc<Mutex<Option<String>>>,
    reloads: broadcast::Sender<u64>,
}

pub struct Server {
    shared: Shared,
    url: String,
    published: Mutex<u64>,
}

impl Server {
    /// Binds 127.0.0.1:`port` (0: any free port) and serves in the background.
    pub async fn start(port: u16) -> std::io::Result<Server> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let address = listener.local_addr()?;
        let (reloads, _) = broadcast::channel(16);
        let shared = Shared {
            latest: Arc::new(Mutex::new(None)),
            invalid: Arc::new(Mutex::new(None)),
            reloads,
        };
        let app = Router::new()
            .route("/", get(report))
            .route("/report.html", get(report))
            .route("/events", get(events))
            .layer(axum::middleware::from_fn(local_host_only))
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Server {
            shared,
            url: format!("http://{address}/"),
            published: Mutex::new(0),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Serves `report` from now on and tells open tabs to reload.
    pub fn publish(&self, report: PathBuf) {
        *self
            .shared
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(report);
        *self
            .shared
            .invalid
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.reload();
    }

    /// Shows `why` the suites cannot run above the last report (`None`: they can again),
    /// and tells open tabs to reload when that changes.
    pub fn invalid(&self, why: Option<String>) {
        let mut invalid = self
            .shared
            .invalid
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *invalid == why {
            return;
        }
        *invalid = why;
        drop(invalid);
        self.reload();
    }

    fn reload(&self) {
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *published += 1;
        // No open tab is not an error.
        let _ = self.shared.reloads.send(*published);
    }
}

/// Answers only requests addressed to this machine by name or address. The report holds
/// the run's transcripts: a web page on another site that rebinds its own host name to
/// 127.0.0.1 (DNS rebinding) reaches the port, but names its own host in `Host`.
async fn local_host_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if is_local_host(host) {
        next.run(request).await
    } else {
        (
            axum::http::StatusCode::MISDIRECTED_REQUEST,
            "trellis watch --serve answers http://127.0.0.1:PORT/ and http://localhost:PORT/ only\n",
        )
            .into_response()
    }
}

/// Whether a `Host` header names this machine: `127.0.0.1`, `localhost` or `[::1]`, with
/// any port.
fn is_local_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    matches!(name, "127.0.0.1" | "::1") || name.eq_ignore_ascii_case("localhost")
}

async fn report(State(shared): State<Shared>) -> impl IntoResponse {
    let latest = shared
        .latest
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let page = match latest {
        Some(path) => match tokio::fs::read_to_string(&path).await {
            Ok(page) => page,
            Err(e) => format!(
                "<!doctype html><html><body><p>Cannot read {}: {e}</p></body></html>",
                path.display()
            ),
        },
        None => WAITING.to_string(),
    };
    let invalid = shared
        .invalid
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let page = match invalid {
        Some(why) => with_banner(&page, &why),
        None => page,
    };
    Html(with_reload(&page))
}

/// The page with a banner saying the suites do not load, at the top of its body: the
/// report below is the last one that ran.
fn with_banner(page: &str, why: &str) -> String {
    let banner = format!(
        "<div class=\"banner warn\" id=\"watch-invalid\"><b>The suites do not load since \
         the last save</b>: the report below is the last run's. Fix them and save.\
         <pre>{}</pre></div>",
        minijinja::HtmlEscape(why)
    );
    let at = page
        .find("<body")
        .and_then(|start| page[start..].find('>').map(|end| start + end + 1))
        .unwrap_or(0);
    format!("{}{banner}{}", &page[..at], &page[at..])
}

/// The page with the reload script, allowed by the page's policy.
fn with_reload(page: &str) -> String {
    trellis_reports::with_served_script(page, RELOAD_SCRIPT)
}

async fn events(
    State(shared): State<Shared>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let rx = shared.reloads.subscribe();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(n) => {
                    let event = Event::default().event("reload").data(n.to_string());
                    return Some((Ok(event), rx));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_machine_is_a_local_host() {
        for host in [
            "127.0.0.1:7357",
            "localhost:7357",
            "LOCALHOST",
            "[::1]:80",
            "127.0.0.1",
        ] {
            assert!(is_local_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7357",
            "127.0.0.1.evil.example",
            "",
            "[::2]:1",
        ] {
            assert!(!is_local_host(host), "{host}");
        }
    }

    #[test]
    fn the_script_goes_before_the_end_of_the_body() {
        let page = with_reload("<html><body><p>x</p></body></html>");
        assert!(page.ends_with(&format!("<script>{RELOAD_SCRIPT}</script></body></html>")));
        assert!(!RELOAD_SCRIPT.contains("</"));
    }
}
