//! How Trellis lays out the JSON it writes (`summary.json`, `compare.json`, `variance.json`,
//! `calibration.json`, a shard's `shard.json`, and the `--json` output of `compare`,
//! `variance` and `calibrate`): indented like `serde_json`'s pretty printer, except that
//! every element of a list is written whole on one line.
//!
//! A run's statistics are lists of rows (one per scenario, branch, node, check), and fully
//! indented a row took 35 lines: a 20,000-scenario run's summary.json was 43 MB, most of it
//! indentation, and the end of every later run next to it read ten such files for the
//! report's trends (docs/performance.md, "The end of big runs: what it reads back, sorts and
//! frees"). One row per line halves the file and keeps it readable and greppable:
//! `grep '"scenario":"refund"' summary.json` prints that scenario's rows (its own, its
//! branches', nodes' and checks'). The commands' `--json` output is laid out the same way
//! ([`crate::to_json_string`]).

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::ser::{Formatter, PrettyFormatter};

/// Pretty outside lists, compact inside each element of one.
pub(crate) struct RowsFormatter {
    pretty: PrettyFormatter<'static>,
    /// Containers open inside the current list element (0: outside any element).
    flat: usize,
    /// A list element is being written: a container it opens is written compact.
    element: bool,
}

impl RowsFormatter {
    pub(crate) fn new() -> Self {
        RowsFormatter {
            pretty: PrettyFormatter::new(),
            flat: 0,
            element: false,
        }
    }

    /// Whether the container about to open is written compact.
    fn opens_flat(&self) -> bool {
        self.flat > 0 || self.element
    }
}

impl RowsFormatter {
    /// Opens a list or an object: compact inside a list element, else as `pretty` does.
    fn open<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        bracket: &[u8],
        pretty: fn(&mut PrettyFormatter<'static>, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.opens_flat() {
            self.flat += 1;
            writer.write_all(bracket)
        } else {
            pretty(&mut self.pretty, writer)
        }
    }

    /// Closes what [`RowsFormatter::open`] opened.
    fn close<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        bracket: &[u8],
        pretty: fn(&mut PrettyFormatter<'static>, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.flat > 0 {
            self.flat -= 1;
            writer.write_all(bracket)
        } else {
            pretty(&mut self.pretty, writer)
        }
    }

    /// Before a list's value or an object's key: a comma after the first when compact.
    fn before<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
        pretty: fn(&mut PrettyFormatter<'static>, &mut W, bool) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.flat > 0 {
            if first {
                Ok(())
            } else {
                writer.write_all(b",")
            }
        } else {
            pretty(&mut self.pretty, writer, first)
        }
    }
}

impl Formatter for RowsFormatter {
    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"[", PrettyFormatter::begin_array)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"]", PrettyFormatter::end_array)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if self.flat == 0 {
            self.element = true;
        }
        self.before(writer, first, PrettyFormatter::begin_array_value)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if self.flat > 0 {
            Ok(())
        } else {
            self.element = false;
            self.pretty.end_array_value(writer)
        }
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"{", PrettyFormatter::begin_object)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"}", PrettyFormatter::end_object)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.before(writer, first, PrettyFormatter::begin_object_key)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if self.flat > 0 {
            writer.write_all(b":")
        } else {
            self.pretty.begin_object_value(writer)
        }
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        if self.flat > 0 {
            Ok(())
        } else {
            self.pretty.end_object_value(writer)
        }
    }
}

/// `value` as [`RowsFormatter`] lays it out.
pub(crate) fn to_writer<W: io::Write>(
    writer: W,
    value: &impl serde::Serialize,
) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::with_formatter(writer, RowsFormatter::new());
    value.serialize(&mut serializer)
}

/// A list of rows rendered apart from the document that holds it
/// ([`to_writer_with_rows`]): each row as [`RowsFormatter`] writes a list's element, on one
/// line, compact.
pub(crate) trait Rows: Sync {
    fn count(&self) -> usize;

    /// Writes the rows in `range`, each after `\n` (`,\n` past the list's first) and
    /// `indent`.
    fn render(
        &self,
        range: std::ops::Range<usize>,
        indent: &[u8],
        out: &mut Vec<u8>,
    ) -> serde_json::Result<()>;
}

impl<T: serde::Serialize + Sync> Rows for Vec<T> {
    fn count(&self) -> usize {
        self.len()
    }

    fn render(
        &self,
        range: std::ops::Range<usize>,
        indent: &[u8],
        out: &mut Vec<u8>,
    ) -> serde_json::Result<()> {
        let first = range.start;
        for (at, row) in self[range].iter().enumerate() {
            out.extend_from_slice(if first + at == 0 { b"\n" } else { b",\n" });
            out.extend_from_slice(indent);
            // Inside a list's element the formatter writes as the compact one does.
            serde_json::to_writer(&mut *out, row)?;
        }
        Ok(())
    }
}

/// Rows rendered at a time, by whichever thread takes them ([`to_writer_with_rows`]).
const CHUNK_ROWS: usize = 512;

/// The document [`to_writer`] writes for `skeleton` with `lists` filled in, the rows
/// rendered on two threads. `skeleton` is the document with each of `lists` empty, and
/// those are its last fields, in the order given (`[("nodes", &nodes), …]`).
///
/// A 20,000-scenario run's summary.json is 80,000 rows and 22 MB, about 95 ms of
/// serde_json on one thread at the end of the run while the other core idled
/// (docs/performance.md, "The end of big runs: what it reads back, sorts and frees"). The
/// rows are rendered in chunks that either thread takes as it is free (a scenario's row is
/// twice a node's: halves by count left one thread idle), and written in order as they are
/// ready, so that only the chunks ahead of the one written wait in memory.
pub(crate) fn to_writer_with_rows<W: io::Write>(
    mut out: W,
    skeleton: &impl serde::Serialize,
    lists: &[(&str, &dyn Rows)],
) -> io::Result<()> {
    let mut text = Vec::new();
    to_writer(&mut text, skeleton)?;
    // Each empty list, found from the end: they are the last fields. Its `[`, and the
    // indentation of its line (where its `]` goes once it has rows).
    let mut places: Vec<(usize, Vec<u8>)> = Vec::with_capacity(lists.len());
    let mut end = text.len();
    for (name, _) in lists.iter().rev() {
        let field = format!("\"{name}\": []");
        let at = find_last(&text[..end], field.as_bytes())
            .ok_or_else(|| io::Error::other(format!("the document has no empty `{name}` list")))?;
        let line = text[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |n| n + 1);
        places.push((at + field.len() - 2, text[line..at].to_vec()));
        end = at;
    }
    places.reverse();
    let row_indents: Vec<Vec<u8>> = places
        .iter()
        .map(|(_, indent)| [indent.as_slice(), b"  "].concat())
        .collect();

    let chunks: Vec<(usize, std::ops::Range<usize>)> = lists
        .iter()
        .enumerate()
        .flat_map(|(list, (_, rows))| {
            (0..rows.count())
                .step_by(CHUNK_ROWS)
                .map(move |at| (list, at..(at + CHUNK_ROWS).min(rows.count())))
        })
        .collect();
    let rendered: Vec<Mutex<Option<serde_json::Result<Vec<u8>>>>> =
        chunks.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    // Renders the next chunk no thread took; false once none is left.
    let take_one = || {
        let at = next.fetch_add(1, Ordering::Relaxed);
        let Some((list, range)) = chunks.get(at) else {
            return false;
        };
        let mut part = Vec::with_capacity(range.len() * 256);
        let done = lists[*list]
            .1
            .render(range.clone(), &row_indents[*list], &mut part)
            .map(|()| part);
        *lock(&rendered[at]) = Some(done);
        true
    };

    // What is written, in order: the skeleton up to each list's `[`, its chunks, its end.
    let mut writer = Ordered {
        text: &text,
        places: &places,
        chunks: &chunks,
        lists: lists.len(),
        list: 0,
        from: 0,
        chunk: 0,
    };
    std::thread::scope(|scope| {
        let helper = std::thread::Builder::new()
            .name("trellis-rows".into())
            .spawn_scoped(scope, || while take_one() {});
        let mut written = Ok(());
        while take_one() {
            if written.is_ok() {
                written = writer.write_ready(&mut out, &rendered);
            }
        }
        if let Ok(helper) = helper {
            helper
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
        written?;
        writer.write_ready(&mut out, &rendered)?;
        writer.finish(&mut out)
    })
}

/// Writes [`to_writer_with_rows`]'s document in order, chunk by chunk as they are rendered.
struct Ordered<'a> {
    text: &'a [u8],
    /// Each list's `[` in `text`, and its line's indentation.
    places: &'a [(usize, Vec<u8>)],
    chunks: &'a [(usize, std::ops::Range<usize>)],
    lists: usize,
    /// The list being written (`lists` past the last).
    list: usize,
    /// Where `text` is written up to.
    from: usize,
    /// The next chunk to write.
    chunk: usize,
}

impl Ordered<'_> {
    /// Writes every chunk rendered from the next one on, with what comes between them.
    fn write_ready(
        &mut self,
        out: &mut impl io::Write,
        rendered: &[Mutex<Option<serde_json::Result<Vec<u8>>>>],
    ) -> io::Result<()> {
        while let Some((list, range)) = self.chunks.get(self.chunk) {
            let Some(part) = lock(&rendered[self.chunk]).take() else {
                return Ok(());
            };
            let part = part?;
            self.close_lists_before(out, *list)?;
            if range.start == 0 {
                let bracket = self.places[*list].0;
                out.write_all(&self.text[self.from..=bracket])?;
                self.from = bracket + 2;
            }
            out.write_all(&part)?;
            self.chunk += 1;
        }
        Ok(())
    }

    /// Ends every list before `list`: its `]` after its rows, or `[]` for one without.
    fn close_lists_before(&mut self, out: &mut impl io::Write, list: usize) -> io::Result<()> {
        while self.list < list {
            let (bracket, indent) = &self.places[self.list];
            if self.from <= *bracket {
                // No row: the skeleton's `[]` as it is.
                out.write_all(&self.text[self.from..bracket + 2])?;
            } else {
                out.write_all(b"\n")?;
                out.write_all(indent)?;
                out.write_all(b"]")?;
            }
            self.from = bracket + 2;
            self.list += 1;
        }
        Ok(())
    }

    /// Ends the last lists and writes the rest of the document.
    fn finish(&mut self, out: &mut impl io::Write) -> io::Result<()> {
        self.close_lists_before(out, self.lists)?;
        out.write_all(&self.text[self.from..])
    }
}

/// A chunk's slot; a panic elsewhere leaves its value as it was.
fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where `needle` last starts in `haystack`.
fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn laid_out(value: &serde_json::Value) -> String {
        let mut out = Vec::new();
        super::to_writer(&mut out, value).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_list_element_is_one_line_and_the_rest_is_indented() {
        let value = json!({
            "run_id": "r1",
            "counts": {"passed": 2, "failed": 0},
            "scenarios": [
                {"scenario": "a", "counts": {"passed": 1}, "at_k": [{"k": 1}, {"k": 2}]},
                {"scenario": "b", "tags": [], "nested": [[1, 2], []]}
            ],
            "suites": ["s"],
            "empty": [],
            "none": {}
        });
        let text = laid_out(&value);
        assert_eq!(
            text,
            r#"{
  "counts": {
    "failed": 0,
    "passed": 2
  },
  "empty": [],
  "none": {},
  "run_id": "r1",
  "scenarios": [
    {"at_k":[{"k":1},{"k":2}],"counts":{"passed":1},"scenario":"a"},
    {"nested":[[1,2],[]],"scenario":"b","tags":[]}
  ],
  "suites": [
    "s"
  ]
}"#
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn a_list_at_the_top_puts_each_element_on_its_line() {
        let value = json!([{"a": {"b": [1]}}, "x", 2]);
        assert_eq!(
            laid_out(&value),
            "[\n  {\"a\":{\"b\":[1]}},\n  \"x\",\n  2\n]"
        );
    }
}
