//! The agent `trellis bench --table` measures against when it is given no `--url`: a
//! Connexity endpoint that answers every turn with the same message, optionally after a
//! fixed delay (the latency-bound figure's 50 ms agent).
//!
//! It lives here rather than in the CLI so that its server is compiled with the other
//! reference agents, at their optimization level (the CLI's crate is built for size,
//! docs/performance.md): the figures measure the engine, not a slower agent.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use axum::routing::post;
use tokio::sync::oneshot;

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
    let alarm = if delay.is_zero() {
        None
    } else {
        Some(Alarm::start()?)
    };
    let app = axum::Router::new().route(
        PATH,
        post(move || {
            let alarm = alarm.clone();
            async move {
                if let Some(alarm) = alarm {
                    alarm.wait(Instant::now() + delay).await;
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    ANSWER,
                )
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

/// Wakes each delayed answer at its deadline, from a thread of its own.
///
/// Why not `tokio::time::sleep`: tokio's timer counts whole milliseconds, rounds every
/// deadline up to the next one, and fires all the timers of a tick together, so under the
/// latency figure's 256 concurrent requests its "50 ms" agent answered in 52.3–52.5 ms at
/// the median (wrk `-c 256`): the figure then measured the agent's timer, not the engine.
/// The thread sleeps until the earliest deadline with the operating system's precision
/// (tens of microseconds) and wakes each answer alone.
#[derive(Clone)]
struct Alarm {
    requests: mpsc::Sender<(Instant, oneshot::Sender<()>)>,
}

/// A deadline waiting on the alarm's thread; ordered by deadline, then by arrival.
struct Pending {
    deadline: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

impl Alarm {
    fn start() -> std::io::Result<Self> {
        let (requests, incoming) = mpsc::channel::<(Instant, oneshot::Sender<()>)>();
        std::thread::Builder::new()
            .name("trellis-agent-alarm".into())
            .spawn(move || {
                let mut pending: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
                let mut seq = 0u64;
                loop {
                    let now = Instant::now();
                    while pending
                        .peek()
                        .is_some_and(|Reverse(first)| first.deadline <= now)
                    {
                        if let Some(Reverse(due)) = pending.pop() {
                            // The request may have gone (its client hung up): nothing to wake.
                            let _ = due.wake.send(());
                        }
                    }
                    let next = match pending.peek() {
                        None => incoming.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(Reverse(first)) => incoming.recv_timeout(first.deadline - now),
                    };
                    match next {
                        Ok((deadline, wake)) => {
                            seq += 1;
                            pending.push(Reverse(Pending {
                                deadline,
                                seq,
                                wake,
                            }));
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        // The server is gone with its runtime.
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Self { requests })
    }

    /// Returns at `deadline`, or at once when the alarm's thread is gone.
    async fn wait(&self, deadline: Instant) {
        let (wake, woken) = oneshot::channel();
        if self.requests.send((deadline, wake)).is_ok() {
            let _ = woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deadlines given out of order wake in order, none before its time.
    #[test]
    fn the_alarm_wakes_each_deadline_in_order_and_never_early() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let alarm = Alarm::start().unwrap();
        let start = Instant::now();
        let woken = runtime.block_on(async {
            let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let waits = [30u64, 5, 20, 10, 0].map(|ms| {
                let (alarm, order) = (alarm.clone(), order.clone());
                let deadline = start + Duration::from_millis(ms);
                async move {
                    alarm.wait(deadline).await;
                    assert!(Instant::now() >= deadline, "woken before {ms} ms");
                    order.lock().unwrap().push(ms);
                }
            });
            futures::future::join_all(waits).await;
            std::mem::take(&mut *order.lock().unwrap())
        });
        assert_eq!(woken, [0, 5, 10, 20, 30]);
    }

    /// The server's answers keep to the delay over real sockets.
    #[test]
    fn a_delayed_answer_comes_no_sooner_than_the_delay() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let url = serve(Duration::from_millis(40)).unwrap();
        let address = url
            .trim_start_matches("http://")
            .trim_end_matches(PATH)
            .to_string();
        runtime.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let sends = (0..8).map(|_| async {
                let sent = Instant::now();
                let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
                let request = format!(
                    "POST {PATH} HTTP/1.1\r\nhost: {address}\r\ncontent-length: 2\r\n\
                     connection: close\r\n\r\n{{}}"
                );
                stream.write_all(request.as_bytes()).await.unwrap();
                let mut answer = String::new();
                stream.read_to_string(&mut answer).await.unwrap();
                (sent.elapsed(), answer)
            });
            for (took, answer) in futures::future::join_all(sends).await {
                assert!(took >= Duration::from_millis(40), "answered in {took:?}");
                let body = answer.split("\r\n\r\n").nth(1);
                assert_eq!(body, Some(ANSWER), "{answer}");
            }
        });
    }
}
