//! `trellis lsp`: a Language Server Protocol server for suite files, over stdio.
//!
//! Diagnostics are the loader's own (every message, span and hint `trellis check` prints);
//! completion, hover, go to definition, references, rename and document symbols read the
//! language table (`trellis_dsl::lang`), so the editor never describes the language a second
//! time. The forgiving reading in [`syntax`] exists because the text being typed rarely
//! parses.

pub mod analysis;
mod diagnostics;
mod features;
pub mod server;
pub mod syntax;
pub mod text;
pub mod transport;

use lsp_server::Connection;
use lsp_types::{
    CompletionOptions, HoverProviderCapability, InitializeParams, OneOf, RenameOptions,
    ServerCapabilities, ServerInfo, TextDocumentSyncCapability, TextDocumentSyncKind,
    WorkDoneProgressOptions,
};

pub use server::{Config, Server, Warnings};

/// Why the server stopped before the client said `exit`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the language client broke the protocol: {0}")]
    Protocol(lsp_server::ProtocolError),
    #[error(
        "the language client closed the connection (`trellis lsp` is started by an editor, \
         which speaks the Language Server Protocol on its stdin and stdout; see docs/editors.md)"
    )]
    Disconnected,
    #[error("reading or writing the client's stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client's initialize request is not valid: {0}")]
    Initialize(#[from] serde_json::Error),
}

impl From<lsp_server::ProtocolError> for Error {
    fn from(e: lsp_server::ProtocolError) -> Self {
        if e.channel_is_disconnected() {
            Error::Disconnected
        } else {
            Error::Protocol(e)
        }
    }
}

impl<T> From<crossbeam_channel::SendError<T>> for Error {
    fn from(_: crossbeam_channel::SendError<T>) -> Self {
        Error::Disconnected
    }
}

/// What the server can do, as told to the client.
pub fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(
            TextDocumentSyncKind::INCREMENTAL,
        )),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec!["\"".into(), "=".into(), ".".into(), "{".into()]),
            ..Default::default()
        }),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        rename_provider: Some(OneOf::Right(RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: WorkDoneProgressOptions::default(),
        })),
        document_symbol_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..Default::default()
    }
}

/// Serves one client on stdin/stdout until it exits.
pub fn serve_stdio(config: Config) -> Result<server::Ended, Error> {
    let (connection, io_threads) = transport::stdio()?;
    let ended = serve(&connection, config)?;
    drop(connection);
    // The client may close its end first; after a clean shutdown that is no error.
    let _ = io_threads.join();
    Ok(ended)
}

/// Waits for the client's `initialize` request, as `lsp_server`'s `initialize_start`
/// does, except that a request sent before it is told so in words (that function's error
/// quoted the request as a Rust debug string) and `exit` ends the wait (`None`).
fn start_initialize(
    connection: &Connection,
) -> Result<Option<(lsp_server::RequestId, serde_json::Value)>, Error> {
    use lsp_server::{ErrorCode, Message, Response};
    loop {
        match connection.receiver.recv() {
            Err(_) => return Err(Error::Disconnected),
            Ok(Message::Request(r)) if r.method == "initialize" => {
                return Ok(Some((r.id, r.params)));
            }
            Ok(Message::Request(r)) => {
                connection.sender.send(Message::Response(Response::new_err(
                    r.id,
                    ErrorCode::ServerNotInitialized as i32,
                    format!(
                        "`{}` before `initialize`: the server waits for the `initialize` \
                         request first",
                        r.method
                    ),
                )))?;
            }
            Ok(Message::Notification(n)) if n.method == "exit" => return Ok(None),
            Ok(Message::Notification(_) | Message::Response(_)) => {}
        }
    }
}

/// Answers `initialize` and waits for `initialized`, as `lsp_server`'s
/// `initialize_finish` does, except that a request sent in between gets the protocol's
/// "server not initialized" error and another notification (`$/setTrace`) is let by:
/// `initialize_finish` gave up on either and left the server answering nothing until its
/// stdin closed, which an editor shows as a hung server. False when the client said `exit`
/// instead.
fn finish_initialize(
    connection: &Connection,
    id: lsp_server::RequestId,
    result: serde_json::Value,
) -> Result<bool, Error> {
    use lsp_server::{ErrorCode, Message, Response};
    connection
        .sender
        .send(Message::Response(Response::new_ok(id, result)))?;
    loop {
        match connection.receiver.recv() {
            Err(_) => return Err(Error::Disconnected),
            Ok(Message::Notification(n)) if n.method == "initialized" => return Ok(true),
            Ok(Message::Notification(n)) if n.method == "exit" => return Ok(false),
            Ok(Message::Notification(_) | Message::Response(_)) => {}
            Ok(Message::Request(r)) => {
                connection.sender.send(Message::Response(Response::new_err(
                    r.id,
                    ErrorCode::ServerNotInitialized as i32,
                    "the server waits for the `initialized` notification".into(),
                )))?;
            }
        }
    }
}

/// Serves one client on `connection` until it exits.
pub fn serve(connection: &Connection, config: Config) -> Result<server::Ended, Error> {
    let caps = serde_json::to_value(capabilities())?;
    // An `exit` before the handshake ends is one without `shutdown`: exit code 1.
    let Some((id, params)) = start_initialize(connection)? else {
        return Ok(server::Ended::ExitedWithoutShutdown);
    };
    let params: InitializeParams = serde_json::from_value(params)?;
    let result = serde_json::json!({
        "capabilities": caps,
        "serverInfo": ServerInfo {
            name: "trellis".into(),
            version: Some(env!("CARGO_PKG_VERSION").into()),
        },
    });
    if !finish_initialize(connection, id, result)? {
        return Ok(server::Ended::ExitedWithoutShutdown);
    }
    if let Some(pid) = params.process_id {
        exit_with_parent(pid);
    }
    let mut roots: Vec<std::path::PathBuf> = params
        .workspace_folders
        .iter()
        .flatten()
        .filter_map(|f| server::to_path(&f.uri))
        .collect();
    #[allow(deprecated)] // Older clients send only `rootUri`.
    if roots.is_empty()
        && let Some(root) = params.root_uri.as_ref().and_then(server::to_path)
    {
        roots.push(root);
    }
    let roots = roots.iter().map(|r| trellis_dsl::canonical(r)).collect();
    // Files changed on disk behind the editor's back (a `git checkout`, a generator) are
    // checked again when the client can tell us about them.
    let can_watch = params
        .capabilities
        .workspace
        .as_ref()
        .and_then(|w| w.did_change_watched_files.as_ref())
        .and_then(|d| d.dynamic_registration)
        .unwrap_or(false);
    if can_watch {
        let options = lsp_types::DidChangeWatchedFilesRegistrationOptions {
            watchers: vec![lsp_types::FileSystemWatcher {
                glob_pattern: lsp_types::GlobPattern::String("**/*.kdl".into()),
                kind: None,
            }],
        };
        let registration = lsp_types::Registration {
            id: "trellis-kdl-files".into(),
            method: "workspace/didChangeWatchedFiles".into(),
            register_options: Some(serde_json::to_value(options)?),
        };
        connection
            .sender
            .send(lsp_server::Message::Request(lsp_server::Request::new(
                lsp_server::RequestId::from("trellis-watch".to_string()),
                "client/registerCapability".into(),
                lsp_types::RegistrationParams {
                    registrations: vec![registration],
                },
            )))?;
    }
    Server::new(config, roots).run(connection)
}

/// Exits once the process `pid` (the editor that started the server, `initialize`'s
/// `processId`) is gone, as the protocol asks: an editor that crashed or was killed never
/// sends `exit` and may keep the server's stdin open through a child of its own, and the
/// server lived on. Looked at once a second; exit code 1, as for an exit without shutdown.
fn exit_with_parent(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    let alive = move || {
        // SAFETY: kill(2) with signal 0 sends nothing; it only checks that `pid` exists.
        let sent = unsafe { libc::kill(pid, 0) };
        sent == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    };
    if !alive() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("trellis-lsp-parent".into())
        .spawn(move || {
            while alive() {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
            std::process::exit(1);
        });
}
