//! The run journal as a file: what `trellis run` appends as its events arrive and what every
//! reader (`trellis report`, `rejudge`, `resume`, the run history, `merge`) reads back.
//!
//! A journal is one JSON [`JournalEntry`] per line (`trellis-records` holds their shapes),
//! compressed as a single zstd stream (`journal.jsonl.zst`). Entries repeat the same keys,
//! ids and texts trajectory after trajectory, so the stream is a small fraction of the JSON
//! (about 20× smaller on one-turn trajectories, below the size of the run's Parquet tables)
//! while staying the crash-safe source of truth: the writer flushes the stream after every
//! entry but node entries (a node is only useful with its trajectory), or, for a writer
//! that is fed faster than that ([`JournalWriter::append_unflushed`], `trellis run`'s
//! recorder), once it has caught up with its queue; a flush ends a zstd block without
//! ending the frame, so later blocks still refer to earlier text and a crash loses at most
//! the trajectories in flight or queued. [`JournalReader`] reads up to the last whole
//! block of a stream cut short (`kill -9`, a lost pod) and says it was cut short.
//!
//! Journals written before compression (`journal.jsonl`, plain JSON lines) are read the
//! same way: [`JournalReader::open`] looks at the file's first bytes, not its name, and
//! [`find`] prefers the compressed name in a run directory. `zstdcat journal.jsonl.zst`
//! shows a journal as plain lines.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use trellis_records::JournalEntry;

/// The journal's file name in a run directory.
pub const FILE: &str = trellis_records::JOURNAL_FILE;
/// The name of journals written before they were compressed (plain JSON lines); still read.
pub const PLAIN_FILE: &str = trellis_records::PLAIN_JOURNAL_FILE;
/// Both names, the current one first.
pub const FILES: [&str; 2] = [FILE, PLAIN_FILE];

/// zstd's fastest regular level: on 50,000 one-turn trajectories flushed one by one it
/// compresses within 2% of level 3 (2.71 MB against 2.66 MB) in 15% less time (~2 µs a
/// trajectory), with 1.5 MB of compressor state against level 3's 3.8 MB.
const LEVEL: i32 = 1;

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The journal a run directory holds, compressed or (written by an older Trellis) plain.
pub fn find(dir: &Path) -> Option<PathBuf> {
    FILES
        .iter()
        .map(|name| dir.join(name))
        .find(|path| std::fs::metadata(path).is_ok_and(|m| m.is_file()))
}

/// Where `dir`'s journal is read from: [`find`], else the name a run writes (so that an
/// error about a missing journal names the file a run would have written).
pub fn path_in(dir: &Path) -> PathBuf {
    find(dir).unwrap_or_else(|| dir.join(FILE))
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum JournalError {
    #[error("cannot write the run journal {}", path.display())]
    #[diagnostic(code(trellis::journal::io))]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the run journal {}", path.display())]
    #[diagnostic(code(trellis::journal::read))]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot encode a journal entry")]
    #[diagnostic(code(trellis::journal::encode))]
    Encode(#[source] serde_json::Error),
}

impl JournalError {
    /// The file the error is about, if it is about one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            JournalError::Write { path, .. } | JournalError::Read { path, .. } => Some(path),
            JournalError::Encode(_) => None,
        }
    }
}

/// Appends entries to a journal as a run produces them.
pub struct JournalWriter {
    path: PathBuf,
    out: zstd::stream::write::Encoder<'static, File>,
    /// An entry's JSON as it is encoded, handed to the compressor in pieces of at most
    /// [`PIECE`] bytes (serde's many small writes would each be a call into zstd; an entry
    /// encoded whole first would hold twice its size, a huge answer's, for the rest of the
    /// run).
    line: Vec<u8>,
    /// Entries written by [`append_unflushed`](JournalWriter::append_unflushed) that a
    /// [`flush`](JournalWriter::flush) has not yet made whole on disk.
    unflushed: bool,
}

impl JournalWriter {
    /// Creates `dir/journal.jsonl.zst` (and `dir`), replacing a file of that name.
    pub fn create(dir: &Path) -> Result<Self, JournalError> {
        std::fs::create_dir_all(dir).map_err(|source| JournalError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        Self::create_at(&dir.join(FILE))
    }

    /// Creates a journal at `path` (a resumed run writes its journal under a temporary name
    /// and renames it into place).
    pub fn create_at(path: &Path) -> Result<Self, JournalError> {
        let write = |source| JournalError::Write {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(write)?;
        let out = zstd::stream::write::Encoder::new(file, LEVEL).map_err(write)?;
        Ok(JournalWriter {
            path: path.to_path_buf(),
            out,
            line: Vec::with_capacity(4096),
            unflushed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the journal to `path` (same filesystem), keeping it open for writing.
    pub fn rename(&mut self, path: &Path) -> Result<(), JournalError> {
        std::fs::rename(&self.path, path).map_err(|source| JournalError::Write {
            path: path.to_path_buf(),
            source,
        })?;
        self.path = path.to_path_buf();
        Ok(())
    }

    pub fn append(&mut self, entry: &JournalEntry) -> Result<(), JournalError> {
        self.encode(entry, !matches!(entry, JournalEntry::Node(_)))
    }

    /// Appends `entry` without ending a block: it is on disk, readable, once
    /// [`flush`](JournalWriter::flush) is called (or the zstd window fills, or the journal
    /// is finished). A writer that receives entries faster than one at a time flushes once
    /// per batch instead of once per trajectory: a zstd block and a `write` each, and
    /// blocks of one trajectory compress worse than blocks of many.
    pub fn append_unflushed(&mut self, entry: &JournalEntry) -> Result<(), JournalError> {
        self.unflushed = true;
        self.encode(entry, false)
    }

    /// Makes every entry appended so far readable from the file (ends a zstd block); a no-op
    /// when there is nothing new.
    pub fn flush(&mut self) -> Result<(), JournalError> {
        if std::mem::take(&mut self.unflushed) {
            self.out.flush().map_err(|e| self.error(e))?;
        }
        Ok(())
    }

    fn encode(&mut self, entry: &JournalEntry, flush: bool) -> Result<(), JournalError> {
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        let pieces = Pieces {
            piece: &mut line,
            out: &mut self.out,
        };
        // Only a write can fail here (every map key is text, every number finite or null):
        // an error leaves the journal with a cut line, which its readers skip and count.
        let encoded = serde_json::to_writer(pieces, entry).map_err(|e| match e.io_error_kind() {
            Some(_) => self.error(io::Error::other(e)),
            None => JournalError::Encode(e),
        });
        let written = encoded.and_then(|()| {
            line.push(b'\n');
            self.write(&line, flush)
        });
        self.line = line;
        written
    }

    /// Appends one entry's line as it was read from another journal (a resumed run keeps
    /// its finished trajectories byte for byte). Flushed unless it is a node's line, as
    /// [`append`](JournalWriter::append) does.
    pub fn append_line(&mut self, line: &[u8]) -> Result<(), JournalError> {
        let line = line.trim_ascii();
        if line.is_empty() {
            return Ok(());
        }
        self.out.write_all(line).map_err(|e| self.error(e))?;
        self.write(b"\n", !is_node_line(line))
    }

    fn write(&mut self, bytes: &[u8], flush: bool) -> Result<(), JournalError> {
        self.out.write_all(bytes).map_err(|e| self.error(e))?;
        // Node lines are only useful with their trajectory line, so flushing after each
        // trajectory is enough to keep every finished trajectory across a crash. A flush
        // ends a zstd block, not the frame: the next block still refers to this one.
        if flush {
            self.unflushed = false;
            self.out.flush().map_err(|e| self.error(e))?;
        }
        Ok(())
    }

    /// Ends the stream (a reader then knows the journal is whole).
    pub fn finish(self) -> Result<PathBuf, JournalError> {
        let JournalWriter { path, out, .. } = self;
        let error = |source| JournalError::Write {
            path: path.clone(),
            source,
        };
        let mut file = out.finish().map_err(error)?;
        file.flush().map_err(error)?;
        Ok(path)
    }

    fn error(&self, source: io::Error) -> JournalError {
        JournalError::Write {
            path: self.path.clone(),
            source,
        }
    }
}

/// The most of an entry's JSON [`JournalWriter`] holds before handing it on.
const PIECE: usize = 64 * 1024;

/// Gathers serde's small writes into pieces of at most [`PIECE`] bytes for `out`; what is
/// left in `piece` at the end is the caller's to write.
struct Pieces<'a, W: Write> {
    piece: &'a mut Vec<u8>,
    out: &'a mut W,
}

impl<W: Write> Pieces<'_, W> {
    /// Hands on what is gathered, then `bytes` too when it is a piece by itself.
    #[cold]
    fn spill(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(self.piece)?;
        self.piece.clear();
        if bytes.len() > PIECE {
            self.out.write_all(bytes)
        } else {
            self.piece.extend_from_slice(bytes);
            Ok(())
        }
    }
}

impl<W: Write> Write for Pieces<'_, W> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.write_all(bytes).map(|()| bytes.len())
    }

    /// serde_json writes through this, a few bytes at a time: the common case is one
    /// `extend_from_slice`, as when it wrote into a `Vec`.
    #[inline]
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.piece.len() + bytes.len() <= PIECE {
            self.piece.extend_from_slice(bytes);
            Ok(())
        } else {
            self.spill(bytes)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether an encoded entry is a node's (the only entries written without a flush).
pub fn is_node_line(line: &[u8]) -> bool {
    line.trim_ascii_start().starts_with(br#"{"node":"#)
}

/// Reads a journal back one line at a time, so memory does not grow with the run. A line
/// that does not parse (typically the last one, cut short by a crash) is skipped and
/// counted rather than failing the whole read: everything finished before it is still
/// worth reading.
pub struct JournalReader {
    path: PathBuf,
    input: Box<dyn BufRead + Send>,
    /// Set when reading the file itself failed, as opposed to a compressed stream that ends
    /// inside a block.
    file_failed: Arc<AtomicBool>,
    line: Vec<u8>,
    skipped: usize,
    cut_short: bool,
}

impl JournalReader {
    /// Opens the journal at `path`, compressed or plain (told by its first bytes).
    pub fn open(path: &Path) -> Result<Self, JournalError> {
        let read = |source| JournalError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file_failed = Arc::new(AtomicBool::new(false));
        let file = File::open(path).map_err(read)?;
        let mut file = BufReader::with_capacity(
            256 * 1024,
            Tap {
                inner: file,
                failed: file_failed.clone(),
            },
        );
        let compressed = file.fill_buf().map_err(read)?.starts_with(&ZSTD_MAGIC);
        let input: Box<dyn BufRead + Send> = if compressed {
            let decoder = zstd::stream::read::Decoder::with_buffer(file).map_err(read)?;
            Box::new(BufReader::with_capacity(256 * 1024, decoder))
        } else {
            Box::new(file)
        };
        Ok(JournalReader {
            path: path.to_path_buf(),
            input,
            file_failed,
            line: Vec::new(),
            skipped: 0,
            cut_short: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines that were not a valid journal entry (including a torn last line).
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// The compressed stream ended inside a block: the writer was killed, or the file was
    /// damaged there. Every entry before that point was read.
    pub fn cut_short(&self) -> bool {
        self.cut_short
    }

    /// The next entry that parses, `None` at the end of the journal.
    pub fn next_entry(&mut self) -> Result<Option<JournalEntry>, JournalError> {
        loop {
            let Some(line) = self.next_line()? else {
                return Ok(None);
            };
            match parse_line(line) {
                Ok(entry) => return Ok(Some(entry)),
                Err(_) => self.skipped += 1,
            }
        }
    }

    /// The next non-blank line, trimmed; `None` at the end of the journal.
    pub fn next_line(&mut self) -> Result<Option<&[u8]>, JournalError> {
        loop {
            self.line.clear();
            if self.cut_short {
                return Ok(None);
            }
            // Bytes, not `read_line`: a line cut inside a multi-byte character must count as
            // one malformed line, not abort the read with an encoding error.
            let read = match self.input.read_until(b'\n', &mut self.line) {
                Ok(read) => read,
                Err(source) if self.file_failed.load(Ordering::Relaxed) => {
                    return Err(JournalError::Read {
                        path: self.path.clone(),
                        source,
                    });
                }
                // The decompressor found the stream incomplete: what it gave before is
                // whole; a line it was in the middle of is torn.
                Err(_) => {
                    self.cut_short = true;
                    if !self.line.trim_ascii().is_empty() {
                        self.skipped += 1;
                    }
                    return Ok(None);
                }
            };
            if read == 0 {
                return Ok(None);
            }
            let complete = self.line.ends_with(b"\n");
            if !self.line.trim_ascii().is_empty() {
                // A last line without its newline was cut short; it may still parse (a
                // plain journal whose writer died mid-line after a whole value).
                if !complete {
                    self.cut_short = true;
                }
                return Ok(Some(self.line.trim_ascii()));
            }
        }
    }
}

/// One journal line's entry. Readers that go through lines themselves (looking at a line's
/// start before parsing it) parse here rather than with `serde_json::from_slice` of their
/// own: the entry's decoder is compiled once, in this crate, not again in each crate that
/// reads a journal.
pub fn parse_line(line: &[u8]) -> Result<JournalEntry, serde_json::Error> {
    serde_json::from_slice(line)
}

/// Reads every entry of the journal at `path` that parses.
pub fn read(path: &Path) -> Result<impl Iterator<Item = JournalEntry>, JournalError> {
    let mut reader = JournalReader::open(path)?;
    Ok(std::iter::from_fn(move || {
        reader.next_entry().ok().flatten()
    }))
}

/// A file whose read errors are remembered, so a decompressor's complaint about the data
/// is told apart from the disk failing under it.
struct Tap {
    inner: File,
    failed: Arc<AtomicBool>,
}

impl Read for Tap {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buf);
        if let Err(e) = &read
            && e.kind() != io::ErrorKind::Interrupted
        {
            self.failed.store(true, Ordering::Relaxed);
        }
        read
    }
}
