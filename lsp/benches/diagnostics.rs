//! How long an editor waits for diagnostics after a change, on a project of 2,000 lines in
//! 11 files and on one of 100,000 lines in 101 files: the time from sending `didChange` to
//! receiving the changed file's `publishDiagnostics`, through the server loop (an in-memory
//! connection instead of stdio). Prints figures; asserts nothing about time.
//!
//! `cargo bench -p trellis-lsp --bench diagnostics`

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::json;

fn scenario(i: usize) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"scenario "s-{i}" {{
    name "Scenario {i}"
    user-context {{
        order_id "A-{i}"
    }}
    user "Hello, order {{{{ user_context.order_id }}}}"
    expect reply contains="postal code"
    user "It is V4T 0A7."
    expect {{
        reply not-contains="sorry"
        latency max="2s"
    }}
    branch "yes" {{
        user "Yes"
        expect no-error
    }}
    branch "no" {{
        user "No"
        expect no-error
    }}
}}
"#
    );
    s
}

fn main() {
    // 10 files of 10 scenarios of 20 lines: 2,000 lines.
    measure(10, 10, 60);
    // 100 files of 50: 100,000 lines (2.3 MB), where the server's cache of the files it
    // loaded (`trellis_dsl::load_cached`) decides the figure.
    measure(100, 50, 20);
}

/// Edits one file of a project of `files` files of `per_file` scenarios `rounds` times.
fn measure(files: usize, per_file: usize, rounds: usize) {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(
        dir.path().join("agents.kdl"),
        "agent \"shop\" protocol=\"connexity\" builtin=\"booking\"\n",
    )
    .expect("written");
    let mut lines = 1;
    for f in 0..files {
        let text: String = (0..per_file).map(|i| scenario(f * per_file + i)).collect();
        lines += text.lines().count();
        std::fs::write(dir.path().join(format!("s{f:03}.kdl")), text).expect("written");
    }
    let target = dir.path().join("s000.kdl");
    let uri = url::Url::from_file_path(&target).expect("absolute path");
    let root = url::Url::from_file_path(dir.path()).expect("absolute path");
    let original = std::fs::read_to_string(&target).expect("read");

    let (server, client) = Connection::memory();
    let thread = std::thread::spawn(move || {
        let config = trellis_lsp::Config {
            protocols: trellis_engine::protocol::registry::specs(),
            warnings: Box::new(trellis_engine::plan::warnings),
        };
        trellis_lsp::serve(&server, config)
    });
    let send = |m: Message| client.sender.send(m).expect("server alive");
    send(Message::Request(Request::new(
        RequestId::from(1),
        "initialize".into(),
        json!({"capabilities": {}, "rootUri": root}),
    )));
    loop {
        if let Ok(Message::Response(_)) = client.receiver.recv() {
            break;
        }
    }
    send(Message::Notification(Notification::new(
        "initialized".into(),
        json!({}),
    )));
    send(Message::Notification(Notification::new(
        "textDocument/didOpen".into(),
        json!({"textDocument": {"uri": uri, "languageId": "kdl", "version": 1, "text": original}}),
    )));
    let wait_for_target = || -> usize {
        loop {
            match client.receiver.recv() {
                Ok(Message::Notification(n)) if n.method == "textDocument/publishDiagnostics" => {
                    if n.params["uri"] == json!(uri) {
                        return n.params["diagnostics"].as_array().map_or(0, Vec::len);
                    }
                }
                Ok(_) => {}
                Err(_) => panic!("server stopped"),
            }
        }
    };
    wait_for_target();

    let mut times: Vec<Duration> = Vec::new();
    for round in 0..rounds {
        // Alternately a typo (one diagnostic) and the fixed text (none).
        let text = if round % 2 == 0 {
            original.replacen("    user \"Yes\"", "    usr \"Yes\"", 1)
        } else {
            original.clone()
        };
        let start = Instant::now();
        send(Message::Notification(Notification::new(
            "textDocument/didChange".into(),
            json!({"textDocument": {"uri": uri, "version": round + 2},
                   "contentChanges": [{"text": text}]}),
        )));
        let found = wait_for_target();
        times.push(start.elapsed());
        assert_eq!(found, usize::from(round % 2 == 0), "round {round}");
    }
    send(Message::Request(Request::new(
        RequestId::from(2),
        "shutdown".into(),
        json!(null),
    )));
    send(Message::Notification(Notification::new(
        "exit".into(),
        json!(null),
    )));
    drop(client);
    let _ = thread.join();

    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "diagnostics after a change, {lines}-line project of {} files ({} changes): median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        files + 1,
        times.len(),
        ms(times[times.len() / 2]),
        ms(times[times.len() * 95 / 100]),
        ms(times[times.len() - 1]),
    );
}
