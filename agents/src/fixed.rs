//! The agent `trellis bench --table` measures against when it is given no `--url`: a
//! Connexity endpoint that answers every turn with the same message, optionally after a
//! fixed delay (the latency-bound figure's 50 ms agent).
//!
//! It lives here rather than in the CLI so that its server is compiled with the other
//! reference agents, at their optimization level (the CLI's crate is built for size,
//! docs/performance.md): the figures measure the engine, not a slower agent.

use std::time::Duration;

use axum::routing::post;

/// The path the agent answers on.
pub const PATH: &str = "/agent/respond";

/// The answer to every turn.
const ANSWER: &str = r#"{"messages":[{"role":"assistant","content":"Hello there."}]}"#;

/// Binds `127.0.0.1:0` and serves the agent on the current tokio runtime (it panics outside
/// one, as `tokio::spawn` does) until that runtime ends; returns the agent's URL.
///
/// Not an `async fn`: a future's body is compiled in the crate that polls it, and this one's
/// server is spawned here so that it is compiled here.
pub fn serve(delay: Duration) -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let url = format!("http://{}{PATH}", listener.local_addr()?);
    let app = axum::Router::new().route(
        PATH,
        post(move || async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                ANSWER,
            )
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}
