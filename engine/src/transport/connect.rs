//! Opening a TCP connection to an agent, so that an agent with a small accept queue costs
//! milliseconds, not seconds.
//!
//! When a listener's accept queue is full, the kernel drops the SYN of a new connection and
//! the client's kernel sends it again only after 1 s, then 3 s, 7 s... A local agent built on
//! Python's `http.server` listens with a queue of 5; at `--jobs 64` a run of 512 trajectories
//! against a 50 ms agent took 14 s instead of under one, and at `--jobs 256` some
//! connections never got through before their turn's timeout (docs/performance.md,
//! "Agents with a small accept queue").
//!
//! On loopback the whole handshake runs inside `connect` (the kernel processes the SYN, the
//! SYN-ACK and the ACK before the call returns), so a connection not made within a few
//! milliseconds had its SYN dropped. It is abandoned and tried again, the allowance doubling
//! each time: the agent's accept queue drains at its own pace and every retry is one SYN.
//! A remote agent's handshake takes a round trip of unknown length: those connections are
//! left to the kernel.
//!
//! Each connection made again is counted by address ([`Redone`]): the run's summary says
//! which agents' queues overflowed, since the wait is in those turns' latencies.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

/// Connection attempts made again because the agent's accept queue was full, by the
/// address they went to. Shared by clones: one per transport, read at the end of a run.
pub type Redone = Tally<SocketAddr>;

/// Events counted by what they happened to (an address, an agent's command), over a
/// transport's life. Shared by clones; a run (or a watch rerun) reports what grew during it.
#[derive(Clone, Debug)]
pub struct Tally<K>(Arc<Mutex<BTreeMap<K, u64>>>);

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally(Arc::default())
    }
}

impl<K: Ord + Clone> Tally<K> {
    /// The counts so far, by key.
    pub fn snapshot(&self) -> BTreeMap<K, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// The counts that grew since `before` (a [`Tally::snapshot`]), by how much.
    pub fn since(&self, before: &BTreeMap<K, u64>) -> BTreeMap<K, u64> {
        self.snapshot()
            .into_iter()
            .filter_map(|(key, n)| {
                let grown = n.saturating_sub(before.get(&key).copied().unwrap_or(0));
                (grown > 0).then_some((key, grown))
            })
            .collect()
    }

    pub(crate) fn add(&self, key: K, n: u64) {
        if let Ok(mut counts) = self.0.lock() {
            *counts.entry(key).or_default() += n;
        }
    }
}

/// Connects to `host_port` (`host:port`, resolved), trying each address in turn as
/// [`TcpStream::connect`] does.
pub(crate) async fn connect_host(host_port: &str, redone: &Redone) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = match host_port
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
    {
        Some((host, port)) if is_localhost(host) => loopbacks(port),
        _ => tokio::net::lookup_host(host_port).await?.collect(),
    };
    connect(&addrs, redone).await
}

/// Whether `host` is `localhost`, which names this machine whatever the resolver says
/// (RFC 6761): an agent listening on `::1` alone is reached through it too, as curl and
/// browsers reach it, even where `/etc/hosts` maps it to 127.0.0.1 only.
pub(crate) fn is_localhost(host: &str) -> bool {
    host.trim_end_matches('.').eq_ignore_ascii_case("localhost")
}

/// Both loopback addresses at `port`, IPv4 first (where local servers most often listen).
pub(crate) fn loopbacks(port: u16) -> Vec<SocketAddr> {
    vec![
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
    ]
}

/// How long a loopback connection's first attempt may take before its SYN counts as
/// dropped. A handshake that was not dropped takes microseconds; this leaves room for a
/// loaded machine that defers the kernel's network processing to its softirq thread.
const FIRST_ALLOWANCE: Duration = Duration::from_millis(5);

/// The longest allowance of one attempt, reached after six doublings: an agent that accepts
/// nothing for a while is offered a SYN four times a second, not hundreds.
const MOST_ALLOWANCE: Duration = Duration::from_millis(250);

/// Connects to the first of `addrs` that takes the connection, or returns the last error.
/// For a loopback address, an attempt not connected within its allowance is abandoned and
/// made again, and counted in `redone`; the caller bounds the whole with its connect
/// timeout.
pub(crate) async fn connect(addrs: &[SocketAddr], redone: &Redone) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address found");
    for &addr in addrs {
        let made = if addr.ip().is_loopback() {
            let mut allowance = FIRST_ALLOWANCE;
            loop {
                let socket = match addr {
                    SocketAddr::V4(_) => TcpSocket::new_v4(),
                    SocketAddr::V6(_) => TcpSocket::new_v6(),
                };
                let socket = match socket {
                    Ok(socket) => socket,
                    Err(e) => break Err(e),
                };
                // Dropping the attempt closes its socket: the SYN the agent's kernel dropped
                // leaves nothing behind on either side.
                if let Ok(made) = tokio::time::timeout(allowance, socket.connect(addr)).await {
                    break made;
                }
                // Counted as it happens, so that attempts before a connect timeout (which
                // drops this future) count too: that is when the notice matters most.
                redone.add(addr, 1);
                allowance = (allowance * 2).min(MOST_ALLOWANCE);
            }
        } else {
            TcpStream::connect(addr).await
        };
        match made {
            Ok(stream) => return Ok(stream),
            // `localhost` tries `::1` after 127.0.0.1: on a machine without IPv6 that
            // address is unavailable, which says less than the first one's refusal.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AddrNotAvailable | io::ErrorKind::Unsupported
                ) && last.kind() != io::ErrorKind::NotFound => {}
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A listener on 127.0.0.1 whose accept queue is full, with the connections filling it.
    async fn full_listener() -> (tokio::net::TcpListener, SocketAddr, Vec<TcpStream>) {
        let listener = TcpSocket::new_v4().expect("socket");
        listener
            .bind("127.0.0.1:0".parse().expect("address"))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        // Linux queues backlog + 1 connections; a backlog of 1 is full after two.
        let listener = listener.listen(1).expect("listen");
        let mut queued = Vec::new();
        for _ in 0..2 {
            queued.push(
                tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr))
                    .await
                    .expect("a connection the queue has room for is made at once")
                    .expect("connect"),
            );
        }
        (listener, addr, queued)
    }

    /// An agent whose accept queue is full drops the next SYN; once it accepts again, the
    /// connection is made within the retries' allowance, not at the kernel's 1 s resend.
    #[tokio::test]
    async fn a_full_accept_queue_costs_milliseconds() {
        let (listener, addr, queued) = full_listener().await;
        // The queue is full: a plain connect's SYN is dropped and not resent for a second.
        let dropped = TcpSocket::new_v4().expect("socket");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), dropped.connect(addr))
                .await
                .is_err(),
            "the accept queue was expected to be full"
        );

        let redone = Redone::default();
        let counted = redone.clone();
        let connecting = tokio::spawn(async move { connect(&[addr], &counted).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let drained = Instant::now();
        for _ in 0..2 {
            listener.accept().await.expect("accept");
        }
        let stream = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .expect("connected")
            .expect("task")
            .expect("connect");
        let waited = drained.elapsed();
        // The allowances are 5, 10, 20, 40, 80 and 160 ms: after the queue drained, the next
        // attempt starts within 160 ms; the kernel's own resend would come after 1 s.
        assert!(
            waited < Duration::from_millis(600),
            "connected {waited:?} after the queue drained"
        );
        assert_eq!(stream.peer_addr().expect("peer"), addr);
        // At least the attempts of the 100 ms the queue stayed full (5 + 10 + 20 + 40 ms).
        let counts = redone.snapshot();
        assert!(
            counts.get(&addr).is_some_and(|&n| n >= 3),
            "attempts made again: {counts:?}"
        );
        assert_eq!(redone.since(&counts), BTreeMap::new());
        drop(queued);
    }

    /// A connect timeout that cuts the retries off still leaves them counted: a run whose
    /// turns fail to connect to an overflowing agent is the one that most needs the notice.
    #[tokio::test]
    async fn attempts_cut_off_by_a_connect_timeout_are_counted() {
        let (_listener, addr, queued) = full_listener().await;
        let redone = Redone::default();
        // The attempts' allowances are 5, 10 and 20 ms: three are given up within 60 ms.
        let cut = tokio::time::timeout(Duration::from_millis(60), connect(&[addr], &redone)).await;
        assert!(cut.is_err(), "the accept queue was expected to stay full");
        assert!(
            redone.snapshot().get(&addr).is_some_and(|&n| n >= 2),
            "attempts made again: {:?}",
            redone.snapshot()
        );
        drop(queued);
    }

    #[tokio::test]
    async fn a_refused_connection_fails_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let started = Instant::now();
        let redone = Redone::default();
        let error = connect(&[addr], &redone)
            .await
            .expect_err("nothing listens");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
        assert!(redone.snapshot().is_empty(), "a refusal is not made again");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
