//! Serving a builtin agent as newline-delimited JSON: one request line in, one answer line
//! out. The same loop answers a TCP or Unix socket connection (several requests per
//! connection, until either side closes it), a long-lived process's stdin/stdout, and — read
//! to the end instead of by line — a process per call, so an agent behaves the same over
//! every line transport the MultiAgentEval harness uses.

use std::future::Future;
use std::io::{self, BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};

/// An agent answering one request (the line without its ending) with one reply (without a
/// line ending, and none inside it).
pub type LineAgent = fn(&[u8]) -> Vec<u8>;

/// The longest request line read; a longer one ends the connection (after an answer
/// saying why), so a client cannot make the agent buffer without bound.
pub const MAX_REQUEST: usize = 64 * 1024 * 1024;

/// A listening socket of either kind.
pub enum LineListener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

impl LineListener {
    async fn accept(&self) -> io::Result<Box<dyn Duplex>> {
        Ok(match self {
            LineListener::Tcp(listener) => Box::new(listener.accept().await?.0),
            LineListener::Unix(listener) => Box::new(listener.accept().await?.0),
        })
    }
}

/// Accepts connections until `stop` completes, answering each on a task of its own.
/// Connections still open when it returns end when the runtime does.
pub async fn serve(listener: LineListener, agent: LineAgent, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    tokio::spawn(async move {
                        // A client that goes away mid-answer is its own business.
                        let _ = serve_connection(stream, agent).await;
                    });
                }
                // Out of file descriptors and the like: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

/// Answers every request line of one connection until the client closes it.
pub async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    agent: LineAgent,
) -> io::Result<()> {
    let (read, mut write) = tokio::io::split(stream);
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read_bytes = (&mut read)
            .take(MAX_REQUEST as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if read_bytes == 0 {
            return Ok(());
        }
        let complete = line.ends_with(b"\n");
        if !complete && line.len() > MAX_REQUEST {
            write.write_all(&too_long()).await?;
            write.flush().await?;
            return Ok(());
        }
        let request = trim(&line);
        if request.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut reply = agent(request);
        reply.push(b'\n');
        write.write_all(&reply).await?;
        write.flush().await?;
    }
}

/// The long-lived process: a request line on `input`, an answer line on `output`, until
/// `input` ends. Blank lines get no answer.
pub fn serve_stdio(
    agent: impl Fn(&[u8]) -> Vec<u8>,
    input: impl BufRead,
    mut output: impl Write,
) -> io::Result<()> {
    let mut input = input.take(u64::MAX);
    let mut line = Vec::new();
    loop {
        line.clear();
        input.set_limit(MAX_REQUEST as u64 + 1);
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if !line.ends_with(b"\n") && line.len() > MAX_REQUEST {
            output.write_all(&too_long())?;
            output.flush()?;
            return Ok(());
        }
        let request = trim(&line);
        if request.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut reply = agent(request);
        reply.push(b'\n');
        output.write_all(&reply)?;
        output.flush()?;
    }
}

/// The process per call: the whole of `input` (no trailing newline needed) is the request,
/// the answer is written once.
pub fn answer_once(
    agent: impl Fn(&[u8]) -> Vec<u8>,
    input: impl Read,
    mut output: impl Write,
) -> io::Result<()> {
    let mut request = Vec::new();
    input.take(MAX_REQUEST as u64).read_to_end(&mut request)?;
    let mut reply = agent(trim(&request));
    reply.push(b'\n');
    output.write_all(&reply)?;
    output.flush()
}

fn trim(line: &[u8]) -> &[u8] {
    let end = line
        .iter()
        .rposition(|b| !matches!(b, b'\n' | b'\r'))
        .map_or(0, |i| i + 1);
    line.get(..end).unwrap_or_default()
}

fn too_long() -> Vec<u8> {
    let mut reply = serde_json::to_vec(&serde_json::json!({
        "action": "error",
        "summary": format!("Unreadable request: a request line is longer than {MAX_REQUEST} bytes"),
    }))
    .unwrap_or_default();
    reply.push(b'\n');
    reply
}

/// A Unix socket path that is free to bind: an existing socket nobody answers on is a
/// leftover of a killed server and is removed; anything else there is an error.
pub fn claim_unix_path(path: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(path.to_path_buf()),
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is in use by another server", path.display()),
                ))
            } else {
                std::fs::remove_file(path)?;
                Ok(path.to_path_buf())
            }
        }
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_upper(request: &[u8]) -> Vec<u8> {
        request.to_ascii_uppercase()
    }

    #[test]
    fn stdio_answers_each_line_and_skips_blank_ones() {
        let mut out = Vec::new();
        let served = serve_stdio(echo_upper, &b"a\r\n\n b\nc"[..], &mut out);
        assert!(served.is_ok());
        assert_eq!(out, b"A\n B\nC\n");
        let mut once = Vec::new();
        assert!(answer_once(echo_upper, &b"x\ny"[..], &mut once).is_ok());
        assert_eq!(once, b"X\nY\n");
    }
}
