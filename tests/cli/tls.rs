//! Agents over `https://`: the system trust store is honoured (`SSL_CERT_FILE`), it is
//! loaded only when a certificate is checked, and a certificate it does not trust is a
//! fault on the turn, not a crash.

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::*;

/// A Connexity agent over TLS with a certificate for `localhost` made for it; returns its
/// port and the certificate (PEM) a client must trust.
async fn https_agent() -> (u16, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let pem = made.cert.pem();
    let key = rustls::pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![made.cert.der().clone()], key)
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request: headers, then the body its content-length announces.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    }
                    buf.drain(..end + 4 + length);
                    let body = r#"{"messages":[{"role":"assistant","content":"Hello over TLS."}]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, pem)
}

fn suite(dir: &Path, port: u16) -> std::path::PathBuf {
    let path = dir.join("suite.kdl");
    std::fs::write(
        &path,
        format!(
            "agent \"secure\" protocol=\"connexity\" url=\"https://localhost:{port}/agent/respond\"\n\
             scenario \"greet\" {{\n    user \"hi\"\n    expect reply contains=\"over TLS\"\n}}\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn an_https_agent_is_trusted_through_the_system_trust_store() {
    let (port, pem) = https_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, pem).unwrap();
    let o = trellis()
        .arg("run")
        .arg(suite(dir.path(), port))
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("SSL_CERT_FILE", &bundle)
        .env_remove("SSL_CERT_DIR")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("1 passed"), "{}", stdout(&o));
}

#[tokio::test]
async fn a_certificate_the_trust_store_does_not_hold_is_a_fault_on_the_turn() {
    let (port, _) = https_agent().await;
    let dir = tempfile::tempdir().unwrap();
    // Trusts another certificate only.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, other.cert.pem()).unwrap();
    let out = dir.path().join("out");
    let o = trellis()
        .arg("run")
        .arg(suite(dir.path(), port))
        .arg("--out")
        .arg(&out)
        .env("SSL_CERT_FILE", &bundle)
        .env_remove("SSL_CERT_DIR")
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let journal = journal_text(&out);
    assert!(
        journal.contains("certificate") || journal.contains("UnknownIssuer"),
        "{journal}"
    );
    assert!(stdout(&o).contains("1 error"), "{}", stdout(&o));
}
