//! Embedded reference agents, served on 127.0.0.1 for the length of a run so example suites
//! and tests exercise the real wire protocol offline.
//!
//! [`serve`] binds an ephemeral loopback port and runs the agent on a spawned task; the
//! returned [`BuiltinServer`] stops it gracefully when dropped or shut down.

pub mod booking;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Names accepted by `builtin="…"`.
pub const BUILTINS: &[&str] = &["booking"];

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
    task: Option<JoinHandle<io::Result<()>>>,
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
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(BuiltinError::Serve {
                name: self.name.to_owned(),
                source,
            }),
            Err(_) => Err(BuiltinError::Crashed {
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

/// Starts the builtin agent `name` on `127.0.0.1:0`. Must be called within a tokio runtime.
pub async fn serve(name: &str) -> Result<BuiltinServer, BuiltinError> {
    let (name, router, path) = match name {
        "booking" => ("booking", booking::router(), booking::PATH),
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
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                // A dropped sender means the same as a sent stop.
                let _ = stopped.await;
            })
            .await
    });
    Ok(BuiltinServer {
        name,
        addr,
        path,
        stop: Some(stop),
        task: Some(task),
    })
}
