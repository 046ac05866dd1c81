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
