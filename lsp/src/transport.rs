//! The server's stdio transport: LSP's framing (`Content-Length` headers, a JSON-RPC body)
//! read and written on two threads, as `lsp_server::Connection::stdio` does, except that a
//! message that cannot be read does not end the server.
//!
//! lsp-server's reader thread stops at the first malformed message (a body that is not JSON,
//! a JSON array, a bad header), and the server then exited 0 with nothing said: the editor's
//! diagnostics silently stopped. Here such a message is said on stderr (editors show the
//! server's stderr in their log), answered with a JSON-RPC error when it carries an id to
//! answer, and skipped; the next message is served.

use std::io::{self, BufRead, Read, Write};
use std::thread::{self, JoinHandle};

use crossbeam_channel::{Sender, bounded, unbounded};
use lsp_server::{Connection, ErrorCode, Message, RequestId, Response};

/// A body larger than this is skipped unread: no editor sends a suite file this large, and
/// a garbage length must not make the server allocate it.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// The reader and writer threads behind a [`Connection`].
pub struct IoThreads {
    reader: JoinHandle<()>,
    writer: JoinHandle<io::Result<()>>,
}

impl IoThreads {
    /// Waits for both threads; the writer's error, if it failed.
    pub fn join(self) -> io::Result<()> {
        let _ = self.reader.join();
        self.writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the LSP writer thread panicked")))
    }
}

/// A connection over stdin and stdout.
pub fn stdio() -> io::Result<(Connection, IoThreads)> {
    let (to_client, outgoing) = bounded::<Message>(0);
    let writer = thread::Builder::new()
        .name("trellis-lsp-writer".into())
        .spawn(move || {
            let stdout = io::stdout();
            let mut stdout = stdout.lock();
            for message in outgoing {
                message.write(&mut stdout)?;
            }
            Ok(())
        })?;
    // Unbounded: while the server checks the project after one edit, the reader takes in
    // the edits typed meanwhile, and the server applies them all before checking again
    // (`Server::run`). Through a channel of no room the reader waited on each hand-over,
    // so the server found at most one edit queued and checked the project once per edit:
    // 50 quick edits of a 36,000-line suite answered a hover 3 s late.
    let (incoming, from_client) = unbounded::<Message>();
    let answers = to_client.clone();
    let reader = thread::Builder::new()
        .name("trellis-lsp-reader".into())
        .spawn(move || {
            let stdin = io::stdin();
            read_messages(&mut stdin.lock(), &incoming, &answers, &mut io::stderr());
        })?;
    Ok((
        Connection {
            sender: to_client,
            receiver: from_client,
        },
        IoThreads { reader, writer },
    ))
}

/// Reads messages from `input` into `incoming` until the input ends, the server stops
/// listening, or the client says `exit`. What cannot be read is told on `log` and, when it
/// has an id, answered through `answers`.
pub fn read_messages(
    input: &mut impl BufRead,
    incoming: &Sender<Message>,
    answers: &Sender<Message>,
    log: &mut impl Write,
) {
    loop {
        let body = match read_body(input) {
            Ok(Some(body)) => body,
            Ok(None) => return,
            Err(Unreadable::Io(e)) => {
                let _ = writeln!(log, "trellis lsp: cannot read the client's stream: {e}");
                return;
            }
            Err(Unreadable::Frame(why)) => {
                let _ = writeln!(log, "trellis lsp: skipped a message: {why}");
                continue;
            }
        };
        let message = match parse(&body) {
            Ok(message) => message,
            Err((id, code, why)) => {
                let _ = writeln!(log, "trellis lsp: skipped a message: {why}");
                if let Some(id) = id {
                    let answer = Response::new_err(id, code as i32, why);
                    if answers.send(Message::Response(answer)).is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let exit = matches!(&message, Message::Notification(n) if n.method == "exit");
        if incoming.send(message).is_err() || exit {
            return;
        }
    }
}

enum Unreadable {
    /// The input failed or ended inside a message: nothing more can be read.
    Io(io::Error),
    /// This message's frame is broken; the next one may be fine.
    Frame(String),
}

impl From<io::Error> for Unreadable {
    fn from(e: io::Error) -> Self {
        Unreadable::Io(e)
    }
}

/// The next message's body, `None` at the end of the input.
fn read_body(input: &mut impl BufRead) -> Result<Option<Vec<u8>>, Unreadable> {
    let mut length = None;
    let mut bad_header = None;
    let mut line = Vec::new();
    let mut any = false;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return if any {
                Err(Unreadable::Io(io::ErrorKind::UnexpectedEof.into()))
            } else {
                Ok(None)
            };
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            if any {
                break;
            }
            // Blank lines between messages carry nothing.
            continue;
        }
        any = true;
        match text.split_once(':') {
            // `…}Content-Length: N`: the unread body of a frame refused before (its length
            // unreadable) runs into the next header; the header at its end starts the next
            // message, so one broken frame never loses the ones after it.
            Some((name, value)) if name.trim().to_ascii_lowercase().ends_with("content-length") => {
                length = value.trim().parse::<usize>().ok();
                if length.is_none() {
                    bad_header = Some(format!("Content-Length `{}` is not a length", value.trim()));
                }
            }
            Some(_) => {}
            None => bad_header = Some(format!("malformed header line {text:?}")),
        }
    }
    let Some(length) = length else {
        return Err(Unreadable::Frame(
            bad_header.unwrap_or_else(|| "no Content-Length header".into()),
        ));
    };
    if length > MAX_BODY {
        io::copy(&mut input.take(length as u64), &mut io::sink())?;
        return Err(Unreadable::Frame(format!(
            "a body of {length} bytes is over the {MAX_BODY}-byte limit"
        )));
    }
    let mut body = vec![0; length];
    input.read_exact(&mut body)?;
    Ok(Some(body))
}

/// The message in `body`, or the id to answer (when it has one), the JSON-RPC error code and
/// why it is not a message.
fn parse(body: &[u8]) -> Result<Message, (Option<RequestId>, ErrorCode, String)> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| (None, ErrorCode::ParseError, format!("not JSON: {e}")))?;
    let id = value
        .get("id")
        .cloned()
        .and_then(|id| serde_json::from_value::<RequestId>(id).ok());
    let has_method = value.get("method").is_some();
    // A response has `result` or `error`; an id with neither, and no method, can only be a
    // request that lost its method, and the client waits for its answer.
    let may_be_response = value.get("result").is_some() || value.get("error").is_some();
    let shape = what_is_wrong(&value);
    serde_json::from_value::<Message>(value).map_err(|_| {
        // Only a request can be answered; a malformed response or notification cannot.
        let id = id.filter(|_| has_method || !may_be_response);
        (
            id,
            ErrorCode::InvalidRequest,
            format!("not a JSON-RPC request, response or notification: {shape}"),
        )
    })
}

/// What a message lacks, in JSON-RPC's terms (serde's own words name Rust's types: "data
/// did not match any variant of untagged enum Message"), when it is plain to see.
fn what_is_wrong(value: &serde_json::Value) -> &'static str {
    let Some(object) = value.as_object() else {
        return "the message is not a JSON object";
    };
    let id_ok = object
        .get("id")
        .is_none_or(|id| id.is_string() || id.is_i64() || id.is_u64());
    match object.get("method") {
        _ if !id_ok => "its `id` is neither a number nor a string",
        Some(serde_json::Value::String(_)) => "its `params` are neither an object nor an array",
        Some(_) => "`method` is not a string",
        None if object.contains_key("result") || object.contains_key("error") => {
            "a response has an `id` and either a `result` or an `error` with a numeric `code` \
             and a `message`"
        }
        None if object.contains_key("id") => {
            "it has an `id` but no `method` (a request) nor `result` or `error` (a response)"
        }
        None => "it has no `method`",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &str) -> String {
        format!("Content-Length: {}\r\n\r\n{body}", body.len())
    }

    #[test]
    fn malformed_messages_are_skipped_and_the_next_one_is_read() {
        let good = r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#;
        let input = [
            frame(r#"{"bad json"#),
            frame("[1, 2]"),
            frame(r#""abc""#),
            frame(r#"{"jsonrpc":"2.0","id":7,"method":5}"#),
            frame(r#"{"jsonrpc":"2.0","id":8,"method":"x","params":"#),
            "Garbage header\r\n\r\n".to_owned(),
            "Content-Length: many\r\n\r\n".to_owned(),
            // A length that is not one, with a body: the body runs into the next header.
            "Content-Length: abc\r\n\r\n{}".to_owned(),
            frame(good),
            frame(r#"{"jsonrpc":"2.0","method":"exit"}"#),
            frame(good),
        ]
        .concat();
        let (incoming, received) = bounded(16);
        let (answers, answered) = bounded(16);
        let mut log = Vec::new();
        read_messages(&mut input.as_bytes(), &incoming, &answers, &mut log);
        let received: Vec<String> = received
            .try_iter()
            .map(|m| match m {
                Message::Notification(n) => n.method,
                other => format!("{other:?}"),
            })
            .collect();
        // Reading stops at `exit`.
        assert_eq!(received, ["initialized", "exit"]);
        let log = String::from_utf8(log).unwrap();
        assert_eq!(log.matches("skipped a message").count(), 8, "{log}");
        // The request with a method that is not a name is answered; no other message had
        // an id that could be.
        let answered: Vec<Message> = answered.try_iter().collect();
        assert_eq!(answered.len(), 1, "{answered:?}");
    }

    #[test]
    fn a_request_that_cannot_be_read_is_answered_with_its_id() {
        let input =
            frame(r#"{"jsonrpc":"2.0","id":3,"method":"textDocument/hover","params":5,"x":[}"#)
                + &frame(r#"{"jsonrpc":"2.0","id":4,"method":["hover"]}"#);
        let (incoming, _received) = bounded(4);
        let (answers, answered) = bounded(4);
        read_messages(&mut input.as_bytes(), &incoming, &answers, &mut Vec::new());
        let answered: Vec<Message> = answered.try_iter().collect();
        // The first is not JSON at all (no id can be read); the second has an id.
        assert_eq!(answered.len(), 1, "{answered:?}");
        let Message::Response(r) = &answered[0] else {
            panic!("{answered:?}")
        };
        assert_eq!(r.id, RequestId::from(4));
        assert_eq!(
            r.response_result.as_ref().err().map(|e| e.code),
            Some(ErrorCode::InvalidRequest as i32)
        );
    }

    /// An id with no method, result or error is a request that lost its method: answered,
    /// in JSON-RPC's words. A malformed response (it has `result`) is not answered.
    #[test]
    fn an_id_without_a_method_is_answered_and_said_plainly() {
        let input = frame(r#"{"jsonrpc":"2.0","id":9}"#)
            + &frame(r#"{"jsonrpc":"2.0","id":10,"result":5,"error":{"code":"x"}}"#);
        let (incoming, _received) = bounded(4);
        let (answers, answered) = bounded(4);
        let mut log = Vec::new();
        read_messages(&mut input.as_bytes(), &incoming, &answers, &mut log);
        let answered: Vec<Message> = answered.try_iter().collect();
        assert_eq!(answered.len(), 1, "{answered:?}");
        let Message::Response(r) = &answered[0] else {
            panic!("{answered:?}")
        };
        assert_eq!(r.id, RequestId::from(9));
        let message = r.response_result.as_ref().err().map(|e| e.message.clone());
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.contains("an `id` but no `method`")),
            "{message:?}"
        );
        let log = String::from_utf8(log).unwrap();
        assert!(!log.contains("untagged enum"), "{log}");
    }
}
