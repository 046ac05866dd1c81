//! The reference agents: one per protocol, served on 127.0.0.1 so the example suites, the
//! projects `trellis init` writes and the tests exercise the real wire protocol offline. The
//! two model APIs (`clerk`, OpenAI chat completions; `concierge`, Anthropic Messages) share
//! one deterministic model, [`model`].
//!
//! The engine does not know them: it asks the [`BuiltinLauncher`] the CLI hands it (as a
//! `trellis_engine::execute::Launcher`) to start `builtin="NAME"` of a protocol, and drops
//! what it got back at the end of the run.
//!
//! [`serve`] binds an ephemeral loopback port and runs the agent on a thread of its own with
//! its own single-threaded runtime, so the agent never competes with the engine's scheduler
//! (its work does not distort the latencies the engine measures, and neither side pays for
//! cross-thread task stealing). The returned [`BuiltinServer`] stops it gracefully when
//! dropped or shut down.
//!
//! The MultiAgentEval agent `support` is also served as newline-delimited JSON
//! ([`serve_socket`]: a TCP port or a Unix socket, [`lines`]) and as a process of the trellis
//! executable (`trellis agent support --stdio|--per-call`). [`BuiltinLauncher::endpoint_for`]
//! starts it the way a suite's `transport` asks and says where it is.

pub mod a2a;
pub mod agentscope;
pub mod anthropic;
pub mod booking;
pub mod fixed;
pub mod fixie;
pub mod forecast;
pub mod langserve;
pub mod lines;
pub mod model;
pub mod openai;
pub mod support;

use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::oneshot;
use trellis_engine::execute::{LaunchError, LaunchRequest, Launched, Launcher};

pub use trellis_dsl::{BuiltinTransport, ProcessMode};
pub use trellis_engine::execute::BuiltinEndpoint;

use lines::{LineAgent, LineListener};

/// Names accepted by `builtin="…"`.
pub const BUILTINS: &[&str] = &[
    "booking",
    "clerk",
    "concierge",
    "forecast",
    "langserve",
    "numbers",
    "support",
    "travel",
    "weather",
];

/// Which protocol each builtin speaks, as `protocol=` spells it: a launch asks for the pair.
const PROTOCOLS: &[(&str, &str)] = &[
    ("connexity", "booking"),
    ("http", "langserve"),
    ("http", "forecast"),
    ("fixie", "numbers"),
    ("multiagent", "support"),
    ("a2a", "travel"),
    ("agentscope", "weather"),
    ("openai", "clerk"),
    ("anthropic", "concierge"),
];

/// Builtins that also speak newline-delimited JSON (sockets, stdio), with their agent.
const LINE_BUILTINS: &[(&str, LineAgent)] = &[("support", support::answer)];

/// The line-speaking agent `name`, if it is one.
pub fn line_agent(name: &str) -> Option<LineAgent> {
    LINE_BUILTINS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, agent)| *agent)
}

/// Names of the builtins served over sockets and stdio.
pub fn line_builtins() -> impl Iterator<Item = &'static str> {
    LINE_BUILTINS.iter().map(|(name, _)| *name)
}

#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    #[error("unknown builtin agent `{name}` (available: {})", BUILTINS.join(", "))]
    Unknown { name: String },
    #[error("could not bind a loopback port for builtin agent `{name}`: {source}")]
    Bind {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("builtin agent `{name}` stopped with an error: {source}")]
    Serve {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("builtin agent `{name}` crashed")]
    Crashed { name: String },
    #[error(
        "builtin agent `{name}` cannot be served over {transport} (only {} can)",
        line_builtins().collect::<Vec<_>>().join(", ")
    )]
    NotALineAgent {
        name: String,
        transport: &'static str,
    },
    #[error(
        "builtin agent `{name}` runs as a process of the trellis executable, and this program \
         ({current}) is not trellis; serve it over http, tcp or unix instead"
    )]
    NoExecutable { name: String, current: String },
    #[error("builtin agent `{name}` does not speak protocol `{protocol}` (it speaks `{speaks}`)")]
    WrongProtocol {
        name: String,
        protocol: String,
        speaks: &'static str,
    },
}

/// A running builtin agent. Dropping it stops the server (without waiting for it).
#[derive(Debug)]
pub struct BuiltinServer {
    name: &'static str,
    addr: SocketAddr,
    path: &'static str,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl BuiltinServer {
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The agent's full endpoint URL, e.g. `http://127.0.0.1:PORT/agent/respond`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.path)
    }

    /// Stops accepting, lets in-flight requests finish, and waits for the server task.
    pub async fn shutdown(mut self) -> Result<(), BuiltinError> {
        if let Some(stop) = self.stop.take() {
            // The task may already be gone; there is nothing left to stop then.
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(source))) => Err(BuiltinError::Serve {
                name: self.name.to_owned(),
                source,
            }),
            Ok(Err(_)) | Err(_) => Err(BuiltinError::Crashed {
                name: self.name.to_owned(),
            }),
        }
    }
}

impl Drop for BuiltinServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Starts the builtin agent `name` on `127.0.0.1:0`. Must be called within a tokio
/// runtime: the server has a thread and a runtime of its own, so it outlives the caller's
/// runtime.
pub async fn serve(name: &str) -> Result<BuiltinServer, BuiltinError> {
    start(name, None)
}

impl BuiltinServer {
    /// Another reference to this server that does not stop it when dropped.
    fn handle(&self) -> BuiltinServer {
        BuiltinServer {
            name: self.name,
            addr: self.addr,
            path: self.path,
            stop: None,
            thread: None,
        }
    }
}

/// The HTTP app of the builtin `name`: its canonical name, router and endpoint path.
/// `otlp` is where an agent that emits OpenTelemetry spans sends them (OTLP/HTTP base URL).
fn http_app(
    name: &str,
    otlp: Option<&str>,
) -> Result<(&'static str, axum::Router, &'static str), BuiltinError> {
    Ok(match name {
        "forecast" => ("forecast", forecast::router(otlp), forecast::PATH),
        "booking" => ("booking", booking::router(), booking::PATH),
        "weather" => ("weather", agentscope::router(), agentscope::PATH),
        "numbers" => ("numbers", fixie::router(), fixie::PATH),
        "support" => ("support", support::router(), support::PATH),
        // An A2A agent is found by its card, under the server's root.
        "travel" => ("travel", a2a::router(), ""),
        "langserve" => ("langserve", langserve::router(), langserve::PATH),
        // Model APIs: the path is the API root, `/v1`, as a `base-url` is written.
        "clerk" => ("clerk", openai::router(), openai::PATH),
        "concierge" => ("concierge", anthropic::router(), anthropic::PATH),
        _ => {
            return Err(BuiltinError::Unknown {
                name: name.to_owned(),
            });
        }
    })
}

/// The path a client calls on the builtin `name`'s HTTP server (`""`: the server's root).
pub fn http_path(name: &str) -> Result<&'static str, BuiltinError> {
    http_app(name, None).map(|(_, _, path)| path)
}

/// Serves the builtin `name` over HTTP on `listener` until `stop` completes, letting
/// requests in flight finish (for `trellis agent NAME --http`).
pub async fn serve_http_on(
    name: &str,
    listener: TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), BuiltinError> {
    // As an OpenTelemetry SDK would, a served agent sends its spans where the standard
    // variable says.
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    let (name, router, _) = http_app(name, otlp.as_deref().filter(|e| !e.is_empty()))?;
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|source| BuiltinError::Serve {
            name: name.to_owned(),
            source,
        })
}

/// Starts the builtin agent `name` on `127.0.0.1:0`, on a thread with a runtime of its own.
fn start(name: &str, otlp: Option<&str>) -> Result<BuiltinServer, BuiltinError> {
    let (name, router, path) = http_app(name, otlp)?;
    let bind_error = |source| BuiltinError::Bind {
        name: name.to_owned(),
        source,
    };
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("builtin-{name}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener)?;
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        // A dropped sender means the same as a sent stop.
                        let _ = stopped.await;
                    })
                    .await
            })
        })
        .map_err(bind_error)?;
    Ok(BuiltinServer {
        name,
        addr,
        path,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// Which socket [`serve_socket`] listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketKind {
    /// An ephemeral port on 127.0.0.1.
    Tcp,
    /// A socket in a fresh temporary directory, removed with the server.
    Unix,
}

/// A builtin agent answering newline-delimited JSON on a socket. Dropping it stops the
/// server (without waiting for it) and removes a Unix socket's directory.
#[derive(Debug)]
pub struct SocketServer {
    name: &'static str,
    address: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// The Unix socket's directory; declared last, so it is removed after the stop signal.
    _dir: Option<tempfile::TempDir>,
}

impl SocketServer {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where a client connects: `tcp:127.0.0.1:PORT` or `unix:/PATH`, as `socket=` and
    /// `trellis_engine::transport::line::LineEndpoint::socket` read it.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops accepting and waits for the server thread.
    pub async fn shutdown(mut self) -> Result<(), BuiltinError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        join_server(self.name, thread).await
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn join_server(
    name: &'static str,
    thread: std::thread::JoinHandle<io::Result<()>>,
) -> Result<(), BuiltinError> {
    match tokio::task::spawn_blocking(move || thread.join()).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(source))) => Err(BuiltinError::Serve {
            name: name.to_owned(),
            source,
        }),
        Ok(Err(_)) | Err(_) => Err(BuiltinError::Crashed {
            name: name.to_owned(),
        }),
    }
}

/// Starts the line-speaking builtin `name` on a socket, on a thread of its own (as
/// [`serve`]). Must be called within a tokio runtime.
pub async fn serve_socket(name: &str, kind: SocketKind) -> Result<SocketServer, BuiltinError> {
    let (name, agent) = LINE_BUILTINS
        .iter()
        .find(|(known, _)| *known == name)
        .copied()
        .ok_or_else(|| match BUILTINS.contains(&name) {
            true => BuiltinError::NotALineAgent {
                name: name.to_owned(),
                transport: match kind {
                    SocketKind::Tcp => "tcp",
                    SocketKind::Unix => "unix",
                },
            },
            false => BuiltinError::Unknown {
                name: name.to_owned(),
            },
        })?;
    let bind_error = |source| BuiltinError::Bind {
        name: name.to_owned(),
        source,
    };
    enum Bound {
        Tcp(std::net::TcpListener),
        Unix(std::os::unix::net::UnixListener),
    }
    let (bound, address, dir) = match kind {
        SocketKind::Tcp => {
            let listener =
                std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(bind_error)?;
            listener.set_nonblocking(true).map_err(bind_error)?;
            let addr = listener.local_addr().map_err(bind_error)?;
            (Bound::Tcp(listener), format!("tcp:{addr}"), None)
        }
        SocketKind::Unix => {
            // In TMPDIR, else in /tmp: a TMPDIR that does not exist, or whose path leaves no
            // room for the socket's name in a socket address (about 108 bytes), would fail
            // every call to this agent as its fault.
            let bind_in = |parent: &Path| -> std::io::Result<_> {
                let dir = tempfile::Builder::new()
                    .prefix("trellis-")
                    .tempdir_in(parent)?;
                let path = dir.path().join(format!("{name}.sock"));
                let listener = std::os::unix::net::UnixListener::bind(&path)?;
                Ok((dir, path, listener))
            };
            let (dir, path, listener) = bind_in(&std::env::temp_dir())
                .or_else(|e| bind_in(Path::new("/tmp")).map_err(|_| e))
                .map_err(bind_error)?;
            listener.set_nonblocking(true).map_err(bind_error)?;
            (
                Bound::Unix(listener),
                format!("unix:{}", path.display()),
                Some(dir),
            )
        }
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("builtin-{name}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = match bound {
                    Bound::Tcp(l) => LineListener::Tcp(TcpListener::from_std(l)?),
                    Bound::Unix(l) => LineListener::Unix(UnixListener::from_std(l)?),
                };
                lines::serve(listener, agent, async move {
                    // A dropped sender means the same as a sent stop.
                    let _ = stopped.await;
                })
                .await;
                Ok(())
            })
        })
        .map_err(bind_error)?;
    Ok(SocketServer {
        name,
        address,
        stop: Some(stop),
        thread: Some(thread),
        _dir: dir,
    })
}

// ---------------------------------------------------------------------------------------------
// Serving a builtin the way a suite's `transport` asks

/// What keeps a served builtin running; drop it at the end of the run.
#[derive(Debug)]
pub enum BuiltinGuard {
    Http(BuiltinServer),
    Socket(SocketServer),
}

/// A builtin served for a run: where it is, and what keeps it running (`None` for a process,
/// which the agent's client starts itself).
#[derive(Debug)]
pub struct ServedBuiltin {
    pub endpoint: BuiltinEndpoint,
    pub guard: Option<BuiltinGuard>,
}

/// Starts the reference agents for runs: what the CLI hands the engine as its launcher.
///
/// Everything it needs is in the value, not in the process: the trellis executable that
/// runs a builtin as a process, and (for `trellis watch`) the HTTP servers kept running
/// across reruns.
#[derive(Debug, Default)]
pub struct BuiltinLauncher {
    /// The trellis executable, for builtins served as processes; `None`: this program, when
    /// it is `trellis`.
    executable: Option<PathBuf>,
    /// Whether HTTP servers are started once and handed out again ([`Self::keep_running`]).
    keep_running: bool,
    /// The servers kept running, one per builtin agent and span receiver it sends to.
    kept: Mutex<Vec<(Option<String>, BuiltinServer)>>,
}

impl BuiltinLauncher {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builtins served as processes (`transport="process"`) run `path` as the agent.
    pub fn with_executable(mut self, path: PathBuf) -> Self {
        self.executable = Some(path);
        self
    }

    /// Starts each builtin agent served over HTTP once and hands out that server again for
    /// as long as this launcher lives (`trellis watch`: reruns do not restart them). Dropping
    /// a handed-out server does not stop it; dropping the launcher does.
    pub fn keep_running(mut self) -> Self {
        self.keep_running = true;
        self
    }

    /// Starts the builtin agent `name` over HTTP (or hands out the one kept running).
    pub async fn serve(&self, name: &str) -> Result<BuiltinServer, BuiltinError> {
        self.serve_with(name, None).await
    }

    /// As [`Self::serve`], sending OpenTelemetry spans to `otlp` (an OTLP/HTTP base URL)
    /// for an agent that emits them.
    pub async fn serve_with(
        &self,
        name: &str,
        otlp: Option<&str>,
    ) -> Result<BuiltinServer, BuiltinError> {
        if !self.keep_running {
            return start(name, otlp);
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        // An agent told of no receiver (or of another) is not the one this run asks for.
        if let Some((_, server)) = kept
            .iter()
            .find(|(to, s)| s.name == name && to.as_deref() == otlp)
        {
            return Ok(server.handle());
        }
        let server = start(name, otlp)?;
        let handle = server.handle();
        kept.push((otlp.map(str::to_owned), server));
        Ok(handle)
    }

    /// Serves the builtin `name` over `transport`: HTTP on a loopback port, a TCP port or a
    /// Unix socket ([`serve_socket`]), or a command running the trellis executable (`agent
    /// NAME --stdio` for a long-lived process, `--per-call` for one per call, as `process`
    /// says); `otlp` is where an agent that emits spans sends them. Must be called within a
    /// tokio runtime.
    pub async fn endpoint_for(
        &self,
        name: &str,
        transport: BuiltinTransport,
        process: ProcessMode,
        otlp: Option<&str>,
    ) -> Result<ServedBuiltin, BuiltinError> {
        Ok(match transport {
            BuiltinTransport::Http => {
                let server = self.serve_with(name, otlp).await?;
                ServedBuiltin {
                    endpoint: BuiltinEndpoint::Url(server.url()),
                    guard: Some(BuiltinGuard::Http(server)),
                }
            }
            BuiltinTransport::Tcp | BuiltinTransport::Unix => {
                let kind = if transport == BuiltinTransport::Tcp {
                    SocketKind::Tcp
                } else {
                    SocketKind::Unix
                };
                let server = serve_socket(name, kind).await?;
                ServedBuiltin {
                    endpoint: BuiltinEndpoint::Socket(server.address().to_owned()),
                    guard: Some(BuiltinGuard::Socket(server)),
                }
            }
            BuiltinTransport::Process => ServedBuiltin {
                endpoint: BuiltinEndpoint::Command(self.agent_command(name, process)?),
                guard: None,
            },
        })
    }

    /// The shell command that runs the builtin `name` as a process of the trellis executable.
    pub fn agent_command(&self, name: &str, process: ProcessMode) -> Result<String, BuiltinError> {
        if line_agent(name).is_none() {
            return Err(if BUILTINS.contains(&name) {
                BuiltinError::NotALineAgent {
                    name: name.to_owned(),
                    transport: "process",
                }
            } else {
                BuiltinError::Unknown {
                    name: name.to_owned(),
                }
            });
        }
        let exe = self
            .trellis_executable()
            .map_err(|current| BuiltinError::NoExecutable {
                name: name.to_owned(),
                current,
            })?;
        let mode = match process {
            ProcessMode::LongLived => "--stdio",
            ProcessMode::PerCall => "--per-call",
        };
        Ok(format!(
            "{} agent {name} {mode}",
            shell_quote(&exe.to_string_lossy())
        ))
    }

    /// The executable given to [`Self::with_executable`], else this program when it is
    /// `trellis`; otherwise a description of this program for the error.
    fn trellis_executable(&self) -> Result<PathBuf, String> {
        if let Some(path) = &self.executable {
            return Ok(path.clone());
        }
        match std::env::current_exe() {
            Ok(path) if path.file_stem().and_then(|s| s.to_str()) == Some("trellis") => Ok(path),
            Ok(path) => Err(path.display().to_string()),
            Err(e) => Err(format!("unknown: {e}")),
        }
    }
}

impl Launcher for BuiltinLauncher {
    fn launch<'a>(
        &'a self,
        request: LaunchRequest<'a>,
    ) -> BoxFuture<'a, Result<Launched, LaunchError>> {
        async move {
            let failed = |e: BuiltinError| LaunchError::Failed(Box::new(e));
            match PROTOCOLS.iter().find(|(_, name)| *name == request.name) {
                None => {
                    return Err(failed(BuiltinError::Unknown {
                        name: request.name.to_owned(),
                    }));
                }
                Some((speaks, _)) if *speaks != request.protocol => {
                    return Err(failed(BuiltinError::WrongProtocol {
                        name: request.name.to_owned(),
                        protocol: request.protocol.to_owned(),
                        speaks,
                    }));
                }
                Some(_) => {}
            }
            let served = self
                .endpoint_for(
                    request.name,
                    request.transport,
                    request.process,
                    request.otlp_endpoint,
                )
                .await
                .map_err(failed)?;
            Ok(Launched {
                endpoint: served.endpoint,
                guard: served
                    .guard
                    .map(|guard| Box::new(guard) as Box<dyn std::any::Any + Send + Sync>),
            })
        }
        .boxed()
    }
}

/// `text` as one word for `sh`: single-quoted, with single quotes spelled `'\''`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Binds `path` for a Unix socket server (a stale socket left by a killed server is replaced).
pub fn bind_unix(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    let path = lines::claim_unix_path(path)?;
    std::os::unix::net::UnixListener::bind(path)
}

/// `frames` as a `text/event-stream` body, for the built-ins that answer a request with one
/// finished stream (the model APIs, LangServe's `/stream`).
pub(crate) fn sse(frames: Vec<String>) -> Response {
    let body = futures::stream::iter(
        frames
            .into_iter()
            .map(|f| Ok::<_, Infallible>(Bytes::from(f))),
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_quote_the_executable() {
        assert_eq!(
            shell_quote("/opt/my trellis/it's"),
            r"'/opt/my trellis/it'\''s'"
        );
        let launcher = BuiltinLauncher::new();
        assert!(matches!(
            launcher.agent_command("booking", ProcessMode::LongLived),
            Err(BuiltinError::NotALineAgent { .. })
        ));
        assert!(matches!(
            launcher.agent_command("nope", ProcessMode::LongLived),
            Err(BuiltinError::Unknown { .. })
        ));
    }

    #[tokio::test]
    async fn a_kept_builtin_is_handed_out_again_only_to_the_same_span_receiver() {
        let launcher = BuiltinLauncher::new().keep_running();
        let untold = launcher.serve_with("forecast", None).await.unwrap();
        let told = launcher
            .serve_with("forecast", Some("http://127.0.0.1:9"))
            .await
            .unwrap();
        assert_ne!(untold.addr(), told.addr());
        let again = launcher
            .serve_with("forecast", Some("http://127.0.0.1:9"))
            .await
            .unwrap();
        assert_eq!(told.addr(), again.addr());
        assert_eq!(
            launcher.serve_with("forecast", None).await.unwrap().addr(),
            untold.addr()
        );
    }

    #[tokio::test]
    async fn a_launch_names_the_protocol_its_builtin_speaks() {
        let launcher = BuiltinLauncher::new();
        let request = |protocol, name| LaunchRequest {
            protocol,
            name,
            transport: BuiltinTransport::Http,
            process: ProcessMode::PerCall,
            otlp_endpoint: None,
        };
        let launched = launcher
            .launch(request("connexity", "booking"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(launched.endpoint, BuiltinEndpoint::Url(ref url) if url.starts_with("http://127.0.0.1:"))
        );
        for (protocol, name, why) in [
            ("a2a", "booking", "does not speak protocol `a2a`"),
            ("connexity", "nope", "unknown builtin agent `nope`"),
        ] {
            match launcher.launch(request(protocol, name)).await {
                Err(e) => assert!(e.to_string().contains(why), "{e}"),
                Ok(l) => panic!("{protocol}/{name} launched: {l:?}"),
            }
        }
        // Every builtin has a protocol, and every protocol entry names a builtin.
        let mut named: Vec<_> = PROTOCOLS.iter().map(|(_, name)| *name).collect();
        named.sort_unstable();
        assert_eq!(named, BUILTINS);
    }
}
