//! Embedded reference agents, served on 127.0.0.1 for the length of a run so example suites
//! and tests exercise the real wire protocol offline.
//!
//! [`serve`] binds an ephemeral loopback port and runs the agent on a thread of its own with
//! its own single-threaded runtime, so the agent never competes with the engine's scheduler
//! (its work does not distort the latencies the engine measures, and neither side pays for
//! cross-thread task stealing). The returned [`BuiltinServer`] stops it gracefully when
//! dropped or shut down.

pub mod agentscope;
pub mod booking;
pub mod fixie;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Names accepted by `builtin="…"`.
pub const BUILTINS: &[&str] = &["booking", "numbers", "weather"];

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

/// Set by [`keep_servers_running`].
static KEEP_RUNNING: AtomicBool = AtomicBool::new(false);
/// The servers kept running, one per builtin agent.
static KEPT: Mutex<Vec<BuiltinServer>> = Mutex::new(Vec::new());

/// From now on, [`serve`] starts each builtin agent once and hands out that server again
/// for the rest of the process (`trellis watch`: reruns do not restart them). Dropping a
/// handed-out server does not stop it.
pub fn keep_servers_running() {
    KEEP_RUNNING.store(true, Ordering::Relaxed);
}

/// Starts the builtin agent `name` on `127.0.0.1:0` (or hands out the one kept running, see
/// [`keep_servers_running`]). Must be called within a tokio runtime: the server has a
/// thread and a runtime of its own, so it outlives the caller's runtime.
pub async fn serve(name: &str) -> Result<BuiltinServer, BuiltinError> {
    if !KEEP_RUNNING.load(Ordering::Relaxed) {
        return start(name);
    }
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(server) = kept.iter().find(|s| s.name == name) {
        return Ok(server.handle());
    }
    let server = start(name)?;
    let handle = server.handle();
    kept.push(server);
    Ok(handle)
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

fn start(name: &str) -> Result<BuiltinServer, BuiltinError> {
    let (name, router, path) = match name {
        "booking" => ("booking", booking::router(), booking::PATH),
        "weather" => ("weather", agentscope::router(), agentscope::PATH),
        "numbers" => ("numbers", fixie::router(), fixie::PATH),
        _ => {
            return Err(BuiltinError::Unknown {
                name: name.to_owned(),
            });
        }
    };
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
