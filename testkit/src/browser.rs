//! A headless chromium driven over the DevTools pipe (`--remote-debugging-pipe`: commands
//! on fd 3, answers on fd 4, NUL-terminated JSON), for tests that check pages the way a user
//! sees them: the HTML report opened as a file, and the page `trellis watch --serve` serves.
//!
//! Every host name is unresolvable and every proxied request refused, so a page can fetch
//! nothing from the network; loopback (the watch server) is reached directly. A browser
//! test fails when [`chromium`] finds no binary (`TRELLIS_CHROMIUM` names one explicitly):
//! a test that passed without running would say the page works when nothing checked it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Longest wait for one answer from the browser: far above what a page this size needs,
/// well below a hung CI job.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The chromium to drive: `TRELLIS_CHROMIUM`, or the first of the usual names on `PATH`.
///
/// # Panics
///
/// When there is none, saying how to install one: the test that asked cannot run.
pub fn chromium() -> PathBuf {
    find_chromium().unwrap_or_else(|| {
        panic!(
            "this test drives a headless Chromium and none was found: install one \
             (`apt-get install chromium`, or Chrome) or set TRELLIS_CHROMIUM to its binary"
        )
    })
}

fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TRELLIS_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    let names = [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
        "chrome",
        "headless_shell",
    ];
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// One headless chromium and one page of it.
pub struct Browser {
    child: Child,
    commands: ChildStdin,
    answers: Receiver<Value>,
    /// Events received while waiting for answers, oldest first.
    events: Vec<Value>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn launch(binary: &Path) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        // The shell maps our stdin/stdout pipes to fds 3 and 4, where chromium expects the
        // DevTools pipe, and sends chromium's own output nowhere.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >/dev/null 2>&1"#)
            .arg(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-extensions",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--mute-audio",
                "--remote-debugging-pipe",
                // Nothing can be fetched even if the page asked: no name resolves, and
                // the proxy every request would go through refuses connections. Only
                // 127.0.0.1 (a server the test started) is reached, directly.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let commands = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let (send, answers) = channel();
        std::thread::spawn(move || {
            let mut message = Vec::new();
            while output.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop_if(|b| *b == 0);
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && send.send(value).is_err()
                {
                    break;
                }
                message.clear();
            }
        });
        let mut browser = Browser {
            child,
            commands,
            answers,
            events: Vec::new(),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = browser.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in [
            "Page.enable",
            "Network.enable",
            "Runtime.enable",
            "Log.enable",
        ] {
            browser.page(domain, json!({}));
        }
        browser
    }

    fn next(&mut self, deadline: Instant) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.answers.recv_timeout(left) {
            Ok(value) => value,
            Err(RecvTimeoutError::Timeout) => panic!("chromium did not answer in time"),
            Err(RecvTimeoutError::Disconnected) => panic!("chromium exited"),
        }
    }

    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&command).unwrap();
        bytes.push(0);
        self.commands.write_all(&bytes).unwrap();
        self.commands.flush().unwrap();
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let message = self.next(deadline);
            if message["id"] == json!(id) {
                assert!(
                    message.get("error").is_none(),
                    "{method} failed: {}",
                    message["error"]
                );
                return message["result"].clone();
            }
            self.events.push(message);
        }
    }

    /// A command to the page's session.
    pub fn page(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call(Some(&session), method, params)
    }

    /// The first event named `method` for which `matches` holds, received before now or
    /// within `within`; `None` when none came in time. Other events are kept.
    pub fn event_where(
        &mut self,
        method: &str,
        within: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        if let Some(at) = self
            .events
            .iter()
            .position(|e| e["method"] == method && matches(e))
        {
            return Some(self.events.remove(at));
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = match self.answers.recv_timeout(left) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => panic!("chromium exited"),
            };
            if message["method"] == method && matches(&message) {
                return Some(message);
            }
            self.events.push(message);
        }
    }

    pub fn wait_for_event(&mut self, method: &str) -> Value {
        if let Some(at) = self.events.iter().position(|e| e["method"] == method) {
            return self.events.remove(at);
        }
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let message = self.next(deadline);
            if message["method"] == method {
                return message;
            }
            self.events.push(message);
        }
    }

    /// Runs `expression` in the page and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.page(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    pub fn events_named(&self, method: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["method"] == method)
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
