//! `trellis agent NAME`: serves a builtin reference agent outside a run, so other harnesses
//! (and trellis's own `transport="process"`) can talk to it.
//!
//! Modes (one at a time):
//! - `--http ADDR` (default `127.0.0.1:0`): HTTP on ADDR, any builtin; prints the endpoint
//!   URL on stdout once listening;
//! - `--listen tcp:HOST:PORT|unix:/PATH` (also `tcp://…`, `unix:///…`): newline-delimited
//!   JSON, several requests per connection; prints the bound address (`tcp:127.0.0.1:PORT`,
//!   so port 0 is usable, or `unix:/PATH`) on stdout once listening; a Unix socket file is
//!   removed when the server stops, and a stale one left by a killed server is replaced;
//! - `--stdio`: a long-lived process, one JSON request line on stdin, one answer line on
//!   stdout, until stdin ends;
//! - `--per-call`: reads stdin to its end (no trailing newline needed), answers once, exits.
//!
//! Line modes serve only the builtins that speak lines (`support`). Logs go to stderr (one
//! line per request in the stdio modes: the action answered). The servers stop cleanly on
//! Ctrl-C or SIGTERM (requests in flight finish) and exit 0; a stdio agent ends with its
//! input. Exit 2 for an unknown agent or address, 1 when serving fails.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use trellis_agents::{self as builtin, BUILTINS, lines};
use trellis_engine::transport::line::LineEndpoint;

use super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK, console};

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("mode").multiple(false))]
pub struct AgentArgs {
    /// The builtin agent: booking (connexity), weather (agentscope), numbers (fixie),
    /// support (multiagent), travel (a2a), langserve (http), forecast (http, with
    /// OpenTelemetry spans), clerk (openai), concierge (anthropic).
    name: String,
    /// Serve newline-delimited JSON on stdin/stdout, one request per line (support only).
    #[arg(long, group = "mode")]
    stdio: bool,
    /// Answer the one request read from stdin (to its end), then exit (support only).
    #[arg(long, group = "mode")]
    per_call: bool,
    /// Serve newline-delimited JSON on a socket: tcp:HOST:PORT or unix:/PATH (support only).
    #[arg(long, group = "mode", value_name = "ADDRESS")]
    listen: Option<String>,
    /// Serve HTTP on HOST:PORT (port 0: any free port). The default mode, on 127.0.0.1:0.
    #[arg(long, group = "mode", value_name = "HOST:PORT")]
    http: Option<String>,
}

pub fn agent(args: AgentArgs) -> u8 {
    if !BUILTINS.contains(&args.name.as_str()) {
        console::errln!(
            "error: unknown builtin agent `{}` (available: {})",
            args.name,
            BUILTINS.join(", ")
        );
        return EXIT_INVALID;
    }
    let line_agent = builtin::line_agent(&args.name);
    let needs_lines = args.stdio || args.per_call || args.listen.is_some();
    let Some(agent) = line_agent.filter(|_| needs_lines) else {
        if needs_lines {
            console::errln!(
                "error: builtin agent `{}` speaks only HTTP; --stdio, --per-call and --listen \
                 serve {}",
                args.name,
                builtin::line_builtins().collect::<Vec<_>>().join(", ")
            );
            return EXIT_INVALID;
        }
        let address = args.http.as_deref().unwrap_or("127.0.0.1:0");
        return with_runtime(|| serve_http(&args.name, address));
    };
    let name = args.name.clone();
    let logged = move |request: &[u8]| {
        let reply = agent(request);
        log_reply(&name, &reply);
        reply
    };
    if args.stdio {
        let stdin = std::io::stdin();
        return finish(
            &args.name,
            lines::serve_stdio(logged, stdin.lock(), std::io::stdout().lock()),
        );
    }
    if args.per_call {
        return finish(
            &args.name,
            lines::answer_once(logged, std::io::stdin().lock(), std::io::stdout().lock()),
        );
    }
    match args.listen.as_deref() {
        Some(address) => with_runtime(|| listen(&args.name, agent, address)),
        None => EXIT_OK,
    }
}

/// The action of a reply, on stderr: the agent's log.
fn log_reply(name: &str, reply: &[u8]) {
    let action = serde_json::from_slice::<serde_json::Value>(reply)
        .ok()
        .and_then(|r| r.get("action").and_then(|a| a.as_str()).map(str::to_owned))
        .unwrap_or_default();
    console::errln!("[{name}] answered {action}");
}

fn finish(name: &str, served: std::io::Result<()>) -> u8 {
    match served {
        Ok(()) => EXIT_OK,
        Err(e) => {
            console::errln!("error: builtin agent `{name}`: {e}");
            EXIT_FAILED
        }
    }
}

fn with_runtime(serve: impl AsyncFnOnce() -> u8) -> u8 {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(serve()),
        Err(e) => {
            console::errln!("error: could not start the runtime: {e}");
            EXIT_FAILED
        }
    }
}

/// Completes at the first Ctrl-C or SIGTERM (the stop signal `run` and `watch` share).
/// Must be created inside the runtime; a signal that cannot be watched keeps its default
/// action (ending the process).
fn stop_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut signals = super::stop::Signals::watch();
    async move {
        signals.next().await;
    }
}

/// Prints the address clients use, as the first line of stdout.
fn announce(text: &str) {
    console::outln!("{text}");
    let _ = std::io::stdout().flush();
}

async fn serve_http(name: &str, address: &str) -> u8 {
    let stop = stop_signal();
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(e) => {
            console::errln!("error: cannot listen on {address}: {e}");
            return EXIT_INVALID;
        }
    };
    let path = builtin::http_path(name).unwrap_or_default();
    match listener.local_addr() {
        Ok(addr) => announce(&format!("http://{addr}{path}")),
        Err(e) => {
            console::errln!("error: {e}");
            return EXIT_FAILED;
        }
    }
    console::errln!("[{name}] serving HTTP; Ctrl-C to stop");
    match builtin::serve_http_on(name, listener, stop).await {
        Ok(()) => {
            console::errln!("[{name}] stopped");
            EXIT_OK
        }
        Err(e) => {
            console::errln!("error: {e}");
            EXIT_FAILED
        }
    }
}

async fn listen(name: &str, agent: lines::LineAgent, address: &str) -> u8 {
    let stop = stop_signal();
    let (listener, shown, socket_file) = match LineEndpoint::socket(address) {
        Ok(LineEndpoint::Tcp(host_port)) => {
            match tokio::net::TcpListener::bind(host_port.as_str()).await {
                Ok(listener) => match listener.local_addr() {
                    Ok(addr) => (
                        lines::LineListener::Tcp(listener),
                        format!("tcp:{addr}"),
                        None,
                    ),
                    Err(e) => {
                        console::errln!("error: {e}");
                        return EXIT_FAILED;
                    }
                },
                Err(e) => {
                    console::errln!("error: cannot listen on {address}: {e}");
                    return EXIT_INVALID;
                }
            }
        }
        Ok(LineEndpoint::Unix(path)) => match bind_unix(&path) {
            Ok(listener) => (
                lines::LineListener::Unix(listener),
                format!("unix:{}", path.display()),
                Some(path),
            ),
            Err(e) => {
                console::errln!("error: cannot listen on {address}: {e}");
                return EXIT_INVALID;
            }
        },
        Ok(LineEndpoint::Process(_)) | Err(_) => {
            console::errln!(
                "error: invalid --listen address `{address}`: expected tcp:HOST:PORT or \
                 unix:/PATH (tcp://HOST:PORT and unix:///PATH also work)"
            );
            return EXIT_INVALID;
        }
    };
    announce(&shown);
    console::errln!("[{name}] serving JSON lines; Ctrl-C to stop");
    lines::serve(listener, agent, stop).await;
    if let Some(path) = socket_file {
        remove_socket(&path);
    }
    console::errln!("[{name}] stopped");
    EXIT_OK
}

fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    let listener = builtin::bind_unix(path)?;
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
}

fn remove_socket(path: &PathBuf) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        console::errln!("warning: could not remove {}: {e}", path.display());
    }
}
