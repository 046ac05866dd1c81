//! Compressed answers. Trellis asks for none (it sends no `Accept-Encoding`), yet some
//! servers, gateways and middleware compress whatever they send. A body whose
//! `Content-Encoding` is gzip or deflate is decoded, within the agent's response size limit
//! (so a small compressed answer cannot expand past it), and an event stream's chunk by
//! chunk as it arrives; any other coding is a fault that names it, instead of a JSON error
//! quoting compressed bytes.

use std::io::Read as _;

use bytes::Bytes;
use reqwest::header::{CONTENT_ENCODING, HeaderMap};

use crate::record::{Fault, FaultCategory};

/// `body` with the codings `headers` name undone, last applied first.
pub fn decoded(headers: &HeaderMap, body: Bytes, max: u64) -> Result<Bytes, Fault> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(body);
    };
    let Ok(value) = value.to_str() else {
        return Err(unknown(&String::from_utf8_lossy(value.as_bytes())));
    };
    let mut body = body;
    for coding in value.rsplit(',').map(str::trim) {
        let coding = coding.to_ascii_lowercase();
        body = match coding.as_str() {
            "" | "identity" => body,
            "gzip" | "x-gzip" => bounded(flate2::read::MultiGzDecoder::new(&body[..]), max)
                .map_err(|e| broken("gzip", &e))?,
            // `deflate` is meant to be zlib-wrapped, but servers send raw deflate too.
            "deflate" => bounded(flate2::read::ZlibDecoder::new(&body[..]), max)
                .or_else(|_| bounded(flate2::read::DeflateDecoder::new(&body[..]), max))
                .map_err(|e| broken("deflate", &e))?,
            _ => return Err(unknown(&coding)),
        };
    }
    Ok(body)
}

/// The codings of a streamed body, undone chunk by chunk as it arrives, never holding more
/// than the stream may decode to in all.
pub struct StreamDecoder {
    coding: &'static str,
    state: Inflate,
    max: u64,
}

enum Inflate {
    Gzip(flate2::write::MultiGzDecoder<Capped>),
    /// `deflate` before its first two bytes say whether it is zlib-wrapped (as meant) or raw
    /// (as some servers send it).
    Deflate(Vec<u8>),
    Zlib(flate2::write::ZlibDecoder<Capped>),
    Raw(flate2::write::DeflateDecoder<Capped>),
}

/// Where a stream decodes into: refuses to grow past `max` bytes decoded in all, so one
/// small compressed chunk cannot take memory past the stream's limit.
struct Capped {
    out: Vec<u8>,
    written: u64,
    max: u64,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written += buf.len() as u64;
        if self.written > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "over the limit",
            ));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl StreamDecoder {
    /// The decoder for `headers`' `Content-Encoding`: `None` without one (or `identity`);
    /// a fault for a coding it does not read, or several stacked. `max`: what the whole
    /// stream may decode to.
    pub fn for_headers(headers: &HeaderMap, max: u64) -> Result<Option<StreamDecoder>, Fault> {
        let Some(value) = headers.get(CONTENT_ENCODING) else {
            return Ok(None);
        };
        let value = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        let codings: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && *c != "identity")
            .collect();
        let sink = || Capped {
            out: Vec::new(),
            written: 0,
            max,
        };
        let (coding, state) = match codings[..] {
            [] => return Ok(None),
            ["gzip" | "x-gzip"] => (
                "gzip",
                Inflate::Gzip(flate2::write::MultiGzDecoder::new(sink())),
            ),
            ["deflate"] => ("deflate", Inflate::Deflate(Vec::new())),
            _ => return Err(unknown(&value)),
        };
        Ok(Some(StreamDecoder { coding, state, max }))
    }

    /// The coding decoded: `gzip` or `deflate`.
    pub fn coding(&self) -> &'static str {
        self.coding
    }

    /// What `chunk` decodes to (possibly nothing yet).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, Fault> {
        use std::io::Write as _;
        if let Inflate::Deflate(head) = &mut self.state {
            head.extend_from_slice(chunk);
            if head.len() < 2 {
                return Ok(Bytes::new());
            }
            let head = std::mem::take(head);
            let sink = Capped {
                out: Vec::new(),
                written: 0,
                max: self.max,
            };
            // RFC 1950: compression method 8, and the first two bytes a multiple of 31.
            let zlib =
                head[0] & 0x0f == 8 && (u16::from(head[0]) << 8 | u16::from(head[1])) % 31 == 0;
            self.state = if zlib {
                Inflate::Zlib(flate2::write::ZlibDecoder::new(sink))
            } else {
                Inflate::Raw(flate2::write::DeflateDecoder::new(sink))
            };
            return self.feed(&head);
        }
        let written = match &mut self.state {
            Inflate::Gzip(d) => d.write_all(chunk).and_then(|()| d.flush()),
            Inflate::Zlib(d) => d.write_all(chunk).and_then(|()| d.flush()),
            Inflate::Raw(d) => d.write_all(chunk).and_then(|()| d.flush()),
            Inflate::Deflate(_) => Ok(()),
        };
        written.map_err(|e| self.fault(e))?;
        Ok(self.take())
    }

    /// What is left once the body ended.
    pub fn finish(&mut self) -> Result<Bytes, Fault> {
        if let Inflate::Deflate(head) = &mut self.state
            && !head.is_empty()
        {
            return Err(self.fault(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)));
        }
        let finished = match &mut self.state {
            Inflate::Gzip(d) => d.try_finish(),
            Inflate::Zlib(d) => d.try_finish(),
            Inflate::Raw(d) => d.try_finish(),
            Inflate::Deflate(_) => Ok(()),
        };
        finished.map_err(|e| self.fault(e))?;
        Ok(self.take())
    }

    fn fault(&self, e: std::io::Error) -> Fault {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            broken(self.coding, &Decode::TooLarge(self.max))
        } else {
            broken(self.coding, &Decode::Broken(e))
        }
    }

    fn take(&mut self) -> Bytes {
        let out = match &mut self.state {
            Inflate::Gzip(d) => &mut d.get_mut().out,
            Inflate::Zlib(d) => &mut d.get_mut().out,
            Inflate::Raw(d) => &mut d.get_mut().out,
            Inflate::Deflate(_) => return Bytes::new(),
        };
        Bytes::from(std::mem::take(out))
    }
}

/// The start of a compressed error body, as far as it decodes (an error body is read only
/// far enough to quote, so its compressed stream is usually cut short): `None` when nothing
/// decodes, or the codings are not gzip or deflate.
pub fn decoded_start(headers: &HeaderMap, body: &[u8], max: usize) -> Option<Bytes> {
    let coding = headers
        .get(CONTENT_ENCODING)?
        .to_str()
        .ok()?
        .trim()
        .to_ascii_lowercase();
    let read_start = |mut reader: Box<dyn std::io::Read + '_>| {
        let mut out = vec![0u8; max];
        let mut filled = 0;
        while filled < max {
            match reader.read(&mut out[filled..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => filled += n,
            }
        }
        out.truncate(filled);
        (!out.is_empty()).then(|| Bytes::from(out))
    };
    match coding.as_str() {
        "gzip" | "x-gzip" => read_start(Box::new(flate2::read::MultiGzDecoder::new(body))),
        "deflate" => read_start(Box::new(flate2::read::ZlibDecoder::new(body)))
            .or_else(|| read_start(Box::new(flate2::read::DeflateDecoder::new(body)))),
        _ => None,
    }
}

/// What `reader` decodes, no more than `max` bytes of it.
fn bounded(reader: impl std::io::Read, max: u64) -> Result<Bytes, Decode> {
    let mut out = Vec::new();
    reader
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(Decode::Broken)?;
    if out.len() as u64 > max {
        return Err(Decode::TooLarge(max));
    }
    Ok(Bytes::from(out))
}

enum Decode {
    Broken(std::io::Error),
    TooLarge(u64),
}

fn broken(coding: &str, error: &Decode) -> Fault {
    match error {
        Decode::TooLarge(max) => super::http::too_large(
            *max,
            &format!("the {coding}-compressed answer decodes to more than that"),
        ),
        Decode::Broken(e) => Fault::new(
            FaultCategory::Protocol,
            format!(
                "the answer says it is {coding}-compressed (Content-Encoding), but does not decode: {e}"
            ),
        ),
    }
}

fn unknown(coding: &str) -> Fault {
    Fault::new(
        FaultCategory::Protocol,
        format!(
            "the answer is compressed with `{coding}` (Content-Encoding), which Trellis does \
             not decode (gzip and deflate are): leave it out of the suite's Accept-Encoding \
             header if it asks for it (Trellis asks for none), or turn that compression off \
             on the agent or the proxy in front of it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn gzip(text: &[u8]) -> Bytes {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        Bytes::from(encoder.finish().unwrap())
    }

    fn zlib(text: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    }

    fn raw_deflate(text: &[u8]) -> Vec<u8> {
        let mut encoder =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    }

    fn with(coding: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_ENCODING, coding.parse().unwrap());
        headers
    }

    #[test]
    fn decodes_gzip_and_deflate_within_the_limit() {
        let body = br#"{"messages":[]}"#;
        assert_eq!(
            decoded(&with("GZIP"), gzip(body), 1000).ok().as_deref(),
            Some(&body[..])
        );
        for compressed in [zlib(body), raw_deflate(body)] {
            assert_eq!(
                decoded(&with("deflate"), Bytes::from(compressed), 1000)
                    .ok()
                    .as_deref(),
                Some(&body[..])
            );
        }
        assert_eq!(
            decoded(&HeaderMap::new(), Bytes::from_static(b"x"), 1)
                .ok()
                .as_deref(),
            Some(&b"x"[..])
        );
    }

    #[test]
    fn a_stream_decodes_chunk_by_chunk() {
        let text = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\n".repeat(50);
        let compressed = gzip(&text);
        let mut decoder = match StreamDecoder::for_headers(&with("gzip"), 1 << 20) {
            Ok(Some(decoder)) => decoder,
            _ => panic!("gzip is read"),
        };
        let mut out = Vec::new();
        for chunk in compressed.chunks(7) {
            out.extend_from_slice(&decoder.feed(chunk).unwrap());
        }
        out.extend_from_slice(&decoder.finish().unwrap());
        assert_eq!(out, text);
        assert!(matches!(
            StreamDecoder::for_headers(&with("identity"), 10),
            Ok(None)
        ));
        assert!(StreamDecoder::for_headers(&with("gzip, br"), 10).is_err());
    }

    /// One small chunk that expands past the stream's limit stops there, without the
    /// memory; deflate streams decode zlib-wrapped or raw, told apart by their first bytes.
    #[test]
    fn a_stream_is_bounded_and_reads_both_deflates() {
        let bomb = gzip(&vec![b' '; 4 << 20]);
        assert!(bomb.len() < 64 * 1024);
        let mut decoder = match StreamDecoder::for_headers(&with("gzip"), 1 << 20) {
            Ok(Some(decoder)) => decoder,
            _ => panic!("gzip is read"),
        };
        let fault = decoder.feed(&bomb).unwrap_err();
        assert_eq!(fault.category, FaultCategory::TooLarge, "{fault:?}");

        let text = b"data: {\"a\": 1}\n\n".repeat(20);
        for compressed in [zlib(&text), raw_deflate(&text)] {
            let mut decoder = match StreamDecoder::for_headers(&with("deflate"), 1 << 20) {
                Ok(Some(decoder)) => decoder,
                _ => panic!("deflate is read"),
            };
            let mut out = Vec::new();
            // One byte first: the form is decided once two have come.
            for piece in [&compressed[..1], &compressed[1..]] {
                out.extend_from_slice(&decoder.feed(piece).unwrap());
            }
            out.extend_from_slice(&decoder.finish().unwrap());
            assert_eq!(out, text);
        }
    }

    /// An error body is read only far enough to quote: its cut compressed stream still
    /// shows what it starts with.
    #[test]
    fn the_start_of_a_cut_error_body_decodes() {
        let page = format!(
            "<html><title>502 Bad Gateway</title>{}</html>",
            "x".repeat(50_000)
        );
        let compressed = gzip(page.as_bytes());
        let cut = &compressed[..compressed.len() / 2];
        let start = decoded_start(&with("gzip"), cut, 4096).unwrap();
        assert!(start.starts_with(b"<html><title>502 Bad Gateway"));
        assert!(start.len() <= 4096);
        assert_eq!(decoded_start(&with("br"), cut, 4096), None);
    }

    #[test]
    fn a_bomb_an_unknown_coding_and_garbage_are_faults() {
        let bomb = gzip(&vec![b' '; 1 << 20]);
        let fault = decoded(&with("gzip"), bomb, 64 * 1024).unwrap_err();
        assert_eq!(fault.category, FaultCategory::TooLarge, "{fault:?}");
        let fault = decoded(&with("br"), Bytes::from_static(b"x"), 10).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(fault.message.contains("`br`"), "{}", fault.message);
        let fault = decoded(&with("gzip"), Bytes::from_static(b"{}"), 10).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(
            fault.message.contains("does not decode"),
            "{}",
            fault.message
        );
    }
}
