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

/// The codings of a streamed body, undone chunk by chunk as it arrives.
pub struct StreamDecoder {
    coding: &'static str,
    inflate: Inflate,
}

enum Inflate {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
}

impl StreamDecoder {
    /// The decoder for `headers`' `Content-Encoding`: `None` without one (or `identity`);
    /// a fault for a coding it does not read, or several stacked.
    pub fn for_headers(headers: &HeaderMap) -> Result<Option<StreamDecoder>, Fault> {
        let Some(value) = headers.get(CONTENT_ENCODING) else {
            return Ok(None);
        };
        let value = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        let codings: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && *c != "identity")
            .collect();
        let inflate = match codings[..] {
            [] => return Ok(None),
            ["gzip" | "x-gzip"] => Inflate::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
            ["deflate"] => Inflate::Zlib(flate2::write::ZlibDecoder::new(Vec::new())),
            _ => return Err(unknown(&value)),
        };
        let coding = match inflate {
            Inflate::Gzip(_) => "gzip",
            Inflate::Zlib(_) => "deflate",
        };
        Ok(Some(StreamDecoder { coding, inflate }))
    }

    /// What `chunk` decodes to (possibly nothing yet).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Bytes, Fault> {
        use std::io::Write as _;
        let written = match &mut self.inflate {
            Inflate::Gzip(decoder) => decoder.write_all(chunk).and_then(|()| decoder.flush()),
            Inflate::Zlib(decoder) => decoder.write_all(chunk).and_then(|()| decoder.flush()),
        };
        written.map_err(|e| broken(self.coding, &Decode::Broken(e)))?;
        Ok(self.take())
    }

    /// What is left once the body ended.
    pub fn finish(&mut self) -> Result<Bytes, Fault> {
        let finished = match &mut self.inflate {
            Inflate::Gzip(decoder) => decoder.try_finish(),
            Inflate::Zlib(decoder) => decoder.try_finish(),
        };
        finished.map_err(|e| broken(self.coding, &Decode::Broken(e)))?;
        Ok(self.take())
    }

    fn take(&mut self) -> Bytes {
        let out = match &mut self.inflate {
            Inflate::Gzip(decoder) => decoder.get_mut(),
            Inflate::Zlib(decoder) => decoder.get_mut(),
        };
        Bytes::from(std::mem::take(out))
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
             not decode (gzip and deflate are); Trellis sends no Accept-Encoding, so turn \
             compression off on the agent or the proxy in front of it"
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
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zlib.write_all(body).unwrap();
        let zlib = Bytes::from(zlib.finish().unwrap());
        assert_eq!(
            decoded(&with("deflate"), zlib, 1000).ok().as_deref(),
            Some(&body[..])
        );
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(body).unwrap();
        let raw = Bytes::from(raw.finish().unwrap());
        assert_eq!(
            decoded(&with("deflate"), raw, 1000).ok().as_deref(),
            Some(&body[..])
        );
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
        let mut decoder = match StreamDecoder::for_headers(&with("gzip")) {
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
            StreamDecoder::for_headers(&with("identity")),
            Ok(None)
        ));
        assert!(StreamDecoder::for_headers(&with("gzip, br")).is_err());
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
