//! Datasets: tables of cases that `scenario ID for-each=DATASET` turns into one scenario per
//! row.
//!
//! A [`RowReader`] streams one file format's rows as JSON objects; CSV, JSON Lines and JSON
//! arrays are read here, and other formats (Parquet, read by the binary through `reports`,
//! so this crate never links an Arrow stack) are added with [`register_reader`]. [`read`]
//! applies a dataset's `filter`, `sample` and `limit` as rows stream by, so only the rows
//! used are ever held. Row ids (`row-id`, or a hash of the row's content) are made here too.

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};

/// One row as the templates see it: its fields, typed, keys as the file names them.
pub type Fields = Map<String, Value>;

/// Why a dataset file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    /// One row (numbered from 1, the header not counted) is malformed.
    #[error("row {row}{}: {message}", column.as_ref().map(|c| format!(", column `{c}`")).unwrap_or_default())]
    Row {
        row: usize,
        column: Option<String>,
        message: String,
    },
    /// The file as a whole is not of its format.
    #[error("{0}")]
    Format(String),
    /// Several rows are malformed: each, up to [`MAX_BAD_ROWS`], in file order.
    #[error("{}", list_rows(.0))]
    Rows(Vec<ReadError>),
}

/// The bad rows said at once: a file exported wrong is usually wrong on many, and one round
/// of `check` per bad row was the way to find them.
pub const MAX_BAD_ROWS: usize = 20;

fn list_rows(rows: &[ReadError]) -> String {
    let mut out = format!("{} bad rows", rows.len());
    if rows.len() >= MAX_BAD_ROWS {
        out.push_str(" (the first; the file may hold more)");
    }
    for row in rows {
        out.push_str("\n- ");
        out.push_str(&row.to_string());
    }
    out
}

/// What a reader hands on for each row: its fields, or why the row does not read (the
/// reader goes on to the next one unless told to stop).
pub type RowVisit<'a> = dyn FnMut(usize, Result<Fields, ReadError>) -> ControlFlow<()> + 'a;

/// A file format's reader: hands each row, in file order and numbered from 1, to `visit`
/// until the file ends or `visit` breaks. A row that does not read is handed on as its
/// error, and the rows after it still are; an error the reader returns is one after which
/// nothing more can be read (the file, or a quote left open that swallowed the rest).
pub trait RowReader: Send + Sync {
    fn read(&self, path: &Path, visit: &mut RowVisit<'_>) -> Result<(), ReadError>;

    /// The columns the file declares whatever its rows (a CSV header, a Parquet schema);
    /// `None` for a format whose columns are only in its rows (JSON). Read only for a file
    /// without rows, so that `row.*` is checked against what it would hold.
    fn declared_columns(&self, path: &Path) -> Result<Option<Vec<String>>, ReadError> {
        let _ = path;
        Ok(None)
    }
}

type Registry = Vec<(&'static str, Arc<dyn RowReader>)>;

/// Readers added by the program (by file extension, without the dot).
static EXTRA: RwLock<Registry> = RwLock::new(Vec::new());

/// The byte order mark editors on Windows start a text file with: part of neither its first
/// line nor any JSON in it.
pub const BOM: &str = "\u{feff}";

/// Line `i` (from 0) of a file, without the [`BOM`] the first one may start with.
pub fn without_bom(i: usize, line: &str) -> &str {
    if i == 0 {
        line.strip_prefix(BOM).unwrap_or(line)
    } else {
        line
    }
}

/// Adds (or replaces) the reader of files ending in `.EXT`: the binary registers Parquet,
/// which this crate does not read itself.
pub fn register_reader(ext: &'static str, reader: Arc<dyn RowReader>) {
    // A poisoned lock only means another registration panicked; the list is still whole.
    let mut extra = EXTRA.write().unwrap_or_else(|e| e.into_inner());
    extra.retain(|(e, _)| *e != ext);
    extra.push((ext, reader));
}

/// The extensions with a reader, built-in ones first (for hints).
pub fn known_extensions() -> Vec<&'static str> {
    let mut out = vec!["csv", "tsv", "jsonl", "ndjson", "json"];
    let extra = EXTRA.read().unwrap_or_else(|e| e.into_inner());
    for (e, _) in extra.iter() {
        if !out.contains(e) {
            out.push(e);
        }
    }
    out
}

/// The reader of `path`'s format: `Ok(None)` for a format this process has no reader of
/// although the language knows it (Parquet in a process that registered none, such as the
/// language server built without the reports crate), `Err` for an unknown extension.
pub fn reader_for(path: &Path) -> Result<Option<Arc<dyn RowReader>>, String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    {
        let extra = EXTRA.read().unwrap_or_else(|e| e.into_inner());
        if let Some((_, r)) = extra.iter().find(|(e, _)| *e == ext) {
            return Ok(Some(Arc::clone(r)));
        }
    }
    match ext.as_str() {
        "csv" => Ok(Some(Arc::new(Csv { tabs: false }))),
        "tsv" | "tab" => Ok(Some(Arc::new(Csv { tabs: true }))),
        "jsonl" | "ndjson" => Ok(Some(Arc::new(JsonLines))),
        "json" => Ok(Some(Arc::new(JsonArray))),
        "parquet" => Ok(None),
        _ => {
            let mut known = known_extensions();
            if !known.contains(&"parquet") {
                known.push("parquet");
            }
            let known: Vec<String> = known.iter().map(|e| format!(".{e}")).collect();
            Err(format!(
                "unknown dataset format `.{ext}`; known: {}",
                known.join(", ")
            ))
        }
    }
}

/// Decides whether a row is kept; an error (why the row cannot be decided) names the row.
/// It gets the row shared, so it can hand the row to a template without copying it.
pub type RowFilter<'a> = &'a mut dyn FnMut(&Arc<Fields>) -> Result<bool, String>;

/// What to keep of a dataset's rows.
pub struct Select<'a> {
    /// Rows that pass, decided as they stream by.
    pub filter: Option<RowFilter<'a>>,
    /// Keep this many rows chosen by content and `seed` (stable when rows are reordered).
    pub sample: Option<(usize, u64)>,
    /// Keep the first this many (after `filter` and `sample`).
    pub limit: Option<usize>,
}

/// A row kept: its number in the file (from 1) and its fields.
#[derive(Clone, Debug)]
pub struct Row {
    pub number: usize,
    pub fields: Arc<Fields>,
}

/// Reads the rows of `path` that `select` keeps, in file order, and the columns seen (in
/// order of first appearance, over every row read, kept or not).
pub fn read(
    reader: &dyn RowReader,
    path: &Path,
    mut select: Select<'_>,
) -> Result<(Vec<String>, Vec<Row>), ReadError> {
    let mut columns: Vec<String> = Vec::new();
    let mut kept: Vec<Row> = Vec::new();
    // The sample: the `n` rows with the smallest seeded content hashes (a max-heap, so the
    // largest is dropped when a smaller one comes).
    let mut sampled: BinaryHeap<(u64, usize, RowBox)> = BinaryHeap::new();
    let mut failure: Option<ReadError> = None;
    let mut bad: Vec<ReadError> = Vec::new();
    let stream_limit = if select.sample.is_none() {
        select.limit
    } else {
        None
    };
    let read = reader.read(path, &mut |number, fields| {
        let fields = match fields {
            Ok(fields) => fields,
            Err(e) => {
                bad.push(e);
                return match bad.len() >= MAX_BAD_ROWS {
                    true => ControlFlow::Break(()),
                    false => ControlFlow::Continue(()),
                };
            }
        };
        // Rows after a bad one are read only for their own faults.
        if !bad.is_empty() {
            return ControlFlow::Continue(());
        }
        // Most files give every row the same keys: only a row with a key not seen yet
        // searches the list (a map lookup per key would cost more than it saves).
        if columns.len() != fields.len() || !fields.keys().zip(&columns).all(|(k, c)| k == c) {
            for k in fields.keys() {
                if !columns.iter().any(|c| c == k) {
                    columns.push(k.clone());
                }
            }
        }
        let fields = Arc::new(fields);
        if let Some(filter) = select.filter.as_mut() {
            match filter(&fields) {
                Ok(true) => {}
                Ok(false) => return ControlFlow::Continue(()),
                Err(message) => {
                    failure = Some(ReadError::Row {
                        row: number,
                        column: None,
                        message,
                    });
                    return ControlFlow::Break(());
                }
            }
        }
        match select.sample {
            Some((n, seed)) => {
                let key = sample_key(&fields, seed);
                sampled.push((key, number, RowBox(fields)));
                if sampled.len() > n {
                    sampled.pop();
                }
            }
            None => kept.push(Row { number, fields }),
        }
        match stream_limit {
            Some(limit) if kept.len() >= limit => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    });
    // What stopped the reader comes after the bad rows it read before it.
    if let Err(e) = read {
        bad.push(e);
    }
    if let Some(e) = failure {
        bad.push(e);
    }
    match bad.len() {
        0 => {}
        1 => return Err(bad.remove(0)),
        _ => return Err(ReadError::Rows(bad)),
    }
    if select.sample.is_some() {
        kept = sampled
            .into_iter()
            .map(|(_, number, RowBox(fields))| Row { number, fields })
            .collect();
        kept.sort_by_key(|r| r.number);
    }
    if let Some(limit) = select.limit {
        kept.truncate(limit);
    }
    kept.shrink_to_fit();
    if columns.is_empty()
        && let Some(declared) = reader.declared_columns(path)?
    {
        columns = declared;
    }
    Ok((columns, kept))
}

/// A row in the sample heap, ordered by its key alone.
struct RowBox(Arc<Fields>);
impl PartialEq for RowBox {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for RowBox {}
impl PartialOrd for RowBox {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for RowBox {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

fn sample_key(fields: &Fields, seed: u64) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.update(canonical_json(&Value::Object(fields.clone())).as_bytes());
    let bytes = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The default row id: the first 12 hex digits of the hash of the row's content, keys
/// sorted, so reordering rows or columns, or appending rows, changes no other row's id. A
/// field that is `null` counts as absent: rows of a file whose objects differ get every
/// column (`null` where they lack it), and a row appended with a new key must not change
/// the others' ids.
pub fn content_id(fields: &Fields) -> String {
    let present: Fields = fields
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let text = canonical_json(&Value::Object(present));
    let hash = blake3::hash(text.as_bytes()).to_hex();
    hash.as_str()[..12].to_string()
}

/// JSON with object keys sorted at every depth (serde_json keeps insertion order when a
/// crate in the build turns on `preserve_order`, which would make hashes order-dependent).
fn canonical_json(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    // With keys inserted in sorted order both map kinds serialize them sorted.
    sorted(v).to_string()
}

/// A row as a template value (`row`): its fields are turned into template values only
/// when a template reads them, so a `filter` over a wide table costs what it reads, not a
/// copy of every row.
#[derive(Debug)]
pub struct RowObject(pub Arc<Fields>);

impl minijinja::value::Object for RowObject {
    fn repr(self: &Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.0
            .get(key.as_str()?)
            .map(|v| minijinja::Value::from(minijinja::value::Serde(v)))
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(
            self.0
                .keys()
                .map(|k| minijinja::Value::from(k.as_str()))
                .collect(),
        )
    }
}

impl RowObject {
    /// `row` for a template.
    pub fn value(fields: &Arc<Fields>) -> minijinja::Value {
        minijinja::Value::from_object(RowObject(Arc::clone(fields)))
    }
}

// ---------------------------------------------------------------------------------------------
// Built-in formats

/// CSV with a header row (the `csv` crate: quoted fields, embedded newlines, CRLF, a UTF-8
/// byte-order mark). A field is typed when it reads back the same: `42`, `-1.5`,
/// `true`/`false`; anything else (`007`, `1.50`, an empty field) stays text, so ids with
/// leading zeros survive. `.tsv` is separated by tabs; a `.csv` whose header has no comma
/// but a semicolon (or a tab) is separated by those, as spreadsheets in many locales write.
struct Csv {
    tabs: bool,
}

/// The separator of a `.csv`: a comma, unless the header line has none and has semicolons
/// or tabs (the more of those two).
fn sniff_delimiter(path: &Path) -> std::io::Result<u8> {
    let mut header = String::new();
    BufReader::new(File::open(path)?).read_line(&mut header)?;
    let count = |c: char| header.matches(c).count();
    Ok(match (count(','), count(';'), count('\t')) {
        (0, s, t) if s > 0 && s >= t => b';',
        (0, _, t) if t > 0 => b'\t',
        _ => b',',
    })
}

impl Csv {
    /// The file opened at its first record, and its header's names (a byte-order mark left
    /// out).
    fn open(&self, path: &Path) -> Result<(csv::Reader<BufReader<File>>, Vec<String>), ReadError> {
        let delimiter = if self.tabs {
            b'\t'
        } else {
            sniff_delimiter(path)?
        };
        let file = File::open(path)?;
        let mut rdr = csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .has_headers(true)
            .flexible(false)
            .from_reader(BufReader::new(file));
        let headers = rdr
            .headers()
            .map_err(|e| csv_error(e, &[]))?
            .iter()
            .map(|h| h.trim_start_matches('\u{feff}').to_string())
            .collect::<Vec<_>>();
        Ok((rdr, headers))
    }
}

impl RowReader for Csv {
    fn declared_columns(&self, path: &Path) -> Result<Option<Vec<String>>, ReadError> {
        let (_, mut headers) = self.open(path)?;
        headers.retain(|h| !h.is_empty());
        Ok(Some(headers))
    }

    fn read(&self, path: &Path, visit: &mut RowVisit<'_>) -> Result<(), ReadError> {
        let (mut rdr, headers) = self.open(path)?;
        if let Some(dup) = headers
            .iter()
            .enumerate()
            .find(|(i, h)| headers[..*i].contains(h))
        {
            return Err(ReadError::Format(format!(
                "the header names column `{}` twice",
                dup.1
            )));
        }
        let mut record = csv::StringRecord::new();
        let mut number = 0;
        // Whether the last field of the row last read spans lines, and its column.
        let mut last_spans_lines = false;
        let mut last_column = 0;
        loop {
            match rdr.read_record(&mut record) {
                Ok(false) if last_spans_lines && !ends_closing_a_quote(path)? => {
                    return Err(ReadError::Row {
                        row: number,
                        column: headers.get(last_column).cloned(),
                        message: "a quoted field is never closed: the file ends inside it, \
                                  and the rows after its opening quote were read as its text"
                            .into(),
                    });
                }
                Ok(false) => return Ok(()),
                Ok(true) => {}
                // A row of the wrong count of fields, one of which spans lines: a quote
                // opened there ran on over the rows after it, which is what to say (its
                // count of fields says only what followed), and nothing after it reads as
                // the file meant.
                Err(e)
                    if matches!(e.kind(), csv::ErrorKind::UnequalLengths { .. })
                        && let Some(spanning) =
                            record.iter().position(|field| field.contains(['\n', '\r'])) =>
                {
                    let line = e.position().map_or(0, csv::Position::line);
                    return Err(ReadError::Row {
                        row: number + 1,
                        column: headers.get(spanning).cloned(),
                        message: format!(
                            "line {line}: a quote opened in this field runs on over the lines \
                             after it (left open?): the row has {} field{} where the header \
                             has {}",
                            record.len(),
                            if record.len() == 1 { "" } else { "s" },
                            headers.len()
                        ),
                    });
                }
                // A row that does not read alone: said, and the next one read.
                Err(e)
                    if matches!(
                        e.kind(),
                        csv::ErrorKind::UnequalLengths { .. } | csv::ErrorKind::Utf8 { .. }
                    ) =>
                {
                    number += 1;
                    if visit(number, Err(csv_error(e, &headers))).is_break() {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(csv_error(e, &headers)),
            }
            number += 1;
            last_column = record.len().saturating_sub(1);
            last_spans_lines = record
                .iter()
                .next_back()
                .is_some_and(|field| field.contains(['\n', '\r']));
            let mut fields = Map::new();
            for (h, v) in headers.iter().zip(record.iter()) {
                fields.insert(h.clone(), csv_value(v));
            }
            if visit(number, Ok(fields)).is_break() {
                return Ok(());
            }
        }
    }
}

/// Whether the file's last character other than white space is a quote: where a quoted
/// field that spans lines ends the file, its closing quote. The `csv` crate takes a quote
/// left open as a field that runs to the end of the file, silently.
fn ends_closing_a_quote(path: &Path) -> Result<bool, ReadError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(path)?;
    let mut end = file.seek(SeekFrom::End(0))?;
    let mut chunk = vec![0u8; 4096];
    // Back from the end, past any amount of trailing white space.
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let piece = &mut chunk[..usize::try_from(end - start).unwrap_or(0)];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(piece)?;
        if let Some(&last) = piece.trim_ascii_end().last() {
            return Ok(last == b'"');
        }
        end = start;
    }
    Ok(false)
}

fn csv_value(text: &str) -> Value {
    match text {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(i) = text.parse::<i64>()
        && i.to_string() == text
    {
        return Value::from(i);
    }
    // A float has a point or an exponent: `-0`, which reads back as itself, would be
    // written `-0.0`. It reads back as JSON writes it (and templates show it): `10.0`, as
    // polars and pandas write a whole float, is a number (Rust's own `10` for it made it
    // text beside the column's `11.25`, and `{{ row.amount > 20 }}` compared text).
    if let Ok(f) = text.parse::<f64>()
        && f.is_finite()
        && text.contains(['.', 'e', 'E'])
        && let Some(n) = serde_json::Number::from_f64(f)
        && n.to_string() == text
    {
        return Value::Number(n);
    }
    Value::String(text.to_string())
}

fn csv_error(e: csv::Error, headers: &[String]) -> ReadError {
    // Rows as users count them: the header is not a row, data rows start at 1. The line
    // too, which an editor shows and a field spanning lines moves away from the row's.
    let row = e
        .position()
        .map(|p| usize::try_from(p.record()).unwrap_or(usize::MAX))
        .unwrap_or(0);
    let line = e.position().map_or(0, csv::Position::line);
    match e.into_kind() {
        csv::ErrorKind::Io(io) => ReadError::Io(io),
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => ReadError::Row {
            row,
            column: headers
                .get(len as usize)
                .cloned()
                .filter(|_| len < expected_len),
            message: format!(
                "line {line}: {len} field{} where the header has {expected_len}",
                if len == 1 { "" } else { "s" }
            ),
        },
        csv::ErrorKind::Utf8 { err, .. } => ReadError::Row {
            row,
            column: headers.get(err.field()).cloned(),
            message: format!("line {line}: not valid UTF-8"),
        },
        other => ReadError::Format(format!("{other:?}")),
    }
}

/// JSON Lines: one object per line; blank lines are skipped.
struct JsonLines;

impl RowReader for JsonLines {
    fn read(&self, path: &Path, visit: &mut RowVisit<'_>) -> Result<(), ReadError> {
        let file = BufReader::new(File::open(path)?);
        let mut number = 0;
        for (i, line) in file.lines().enumerate() {
            let line = line.map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => ReadError::Row {
                    row: number + 1,
                    column: None,
                    message: format!("line {} is not valid UTF-8", i + 1),
                },
                _ => ReadError::Io(e),
            })?;
            let line = without_bom(i, &line);
            if line.trim().is_empty() {
                continue;
            }
            number += 1;
            let fields = match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(m)) => Ok(m),
                Ok(other) => Err(ReadError::Row {
                    row: number,
                    column: None,
                    message: format!(
                        "line {} is a JSON {}, not an object",
                        i + 1,
                        json_kind(&other)
                    ),
                }),
                Err(e) => Err(ReadError::Row {
                    row: number,
                    column: None,
                    message: format!("line {}: {e}", i + 1),
                }),
            };
            if visit(number, fields).is_break() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// A JSON array of objects, read element by element (never the whole array at once); or an
/// object holding that array under some key (`{"data": [...]}`, `{"version": 1, "examples":
/// [...]}`), as many exports wrap their cases: the one member that is an array is read.
struct JsonArray;

/// The state of one `.json` read, shared by the visitors.
struct JsonRows<'v> {
    visit: &'v mut RowVisit<'v>,
    problem: Option<ReadError>,
    /// `visit` had what it needed: what serde says of the unread rest is not an error.
    stopped: bool,
    /// The key of the array read from a top-level object.
    found: Option<String>,
}

impl JsonRows<'_> {
    fn rows<'de, A: serde::de::SeqAccess<'de>>(&mut self, mut seq: A) -> Result<(), A::Error> {
        let mut number = 0;
        while let Some(v) = seq.next_element::<Value>()? {
            number += 1;
            let fields = match v {
                Value::Object(fields) => Ok(fields),
                v => Err(ReadError::Row {
                    row: number,
                    column: None,
                    message: format!(
                        "element {number}{} is a JSON {}, not an object",
                        self.found
                            .as_ref()
                            .map(|k| format!(" of `{k}`"))
                            .unwrap_or_default(),
                        json_kind(&v)
                    ),
                }),
            };
            if (self.visit)(number, fields).is_break() {
                // The rest is not needed; the reader stops here.
                self.stopped = true;
                return Ok(());
            }
        }
        Ok(())
    }
}

impl<'de> serde::de::Visitor<'de> for &mut JsonRows<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of objects, or an object holding one")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.rows(seq)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            keys.push(key.clone());
            map.next_value_seed(Member {
                rows: &mut *self,
                key,
            })?;
            if self.stopped {
                return Ok(());
            }
        }
        if self.found.is_none() {
            self.problem = Some(ReadError::Format(format!(
                "a JSON object without an array of cases (its keys: {}); a `.json` dataset is \
                 an array of objects, or an object holding one",
                if keys.is_empty() {
                    "none".to_string()
                } else {
                    keys.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        }
        Ok(())
    }
}

/// A member of a top-level object: an array is the rows (the first one only), anything else
/// is skipped without being kept.
struct Member<'r, 'v> {
    rows: &'r mut JsonRows<'v>,
    key: String,
}

impl<'de> serde::de::DeserializeSeed<'de> for Member<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Member<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if let Some(first) = &self.rows.found {
            self.rows.problem = Some(ReadError::Format(format!(
                "the JSON object holds two arrays, `{first}` and `{}`: which are the cases is \
                 not clear; write the cases as a top-level array",
                self.key
            )));
            self.rows.stopped = true;
            return Ok(());
        }
        self.rows.found = Some(self.key);
        self.rows.rows(&mut seq)?;
        if !self.rows.stopped {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

impl RowReader for JsonArray {
    fn read(&self, path: &Path, visit: &mut RowVisit<'_>) -> Result<(), ReadError> {
        use serde::de::Deserializer;

        let mut file = BufReader::new(File::open(path)?);
        // A byte order mark (editors on Windows) is not JSON; skip it.
        if std::io::BufRead::fill_buf(&mut file)?.starts_with(BOM.as_bytes()) {
            std::io::BufRead::consume(&mut file, BOM.len());
        }
        let mut de = serde_json::Deserializer::from_reader(file);
        let mut rows = JsonRows {
            visit,
            problem: None,
            stopped: false,
            found: None,
        };
        let result = (&mut de).deserialize_any(&mut rows);
        if let Some(p) = rows.problem {
            return Err(p);
        }
        match result {
            // Stopped early (limit reached): the rest of the file is never read.
            _ if rows.stopped => Ok(()),
            Ok(()) => de
                .end()
                .map_err(|e| ReadError::Format(format!("not a JSON array of objects: {e}"))),
            Err(e) if e.is_io() => Err(ReadError::Io(e.into())),
            Err(e) => Err(ReadError::Format(format!(
                "not a JSON array of objects: {e}"
            ))),
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ---------------------------------------------------------------------------------------------
// Conversations

/// Checks and normalizes a message list: each an object with a known `role`; `content`
/// text, `null`, or OpenAI content parts (their text joined); `tool_calls`,
/// `tool_call_id` and `name` kept.
pub fn messages(value: Value) -> Result<Vec<Value>, String> {
    let list = match value {
        Value::Array(list) => list,
        Value::Object(mut o) => match o.remove("messages") {
            Some(Value::Array(list)) => list,
            _ => return Err("an object without a `messages` list".into()),
        },
        _ => return Err("not a list of messages".into()),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let n = i + 1;
        let Value::Object(m) = m else {
            return Err(format!("message {n} is not an object"));
        };
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(format!(
                "message {n} has role `{role}`; roles are system, developer, user, assistant, tool"
            ));
        }
        // A user message of text must say something; one of content parts may hold only an
        // image (exports of real conversations do), and keeps its (empty) text.
        let content = match m.get("content") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) if role == "user" && s.trim().is_empty() => {
                return Err(format!("message {n} (user) has no text"));
            }
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => Value::String(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            Some(_) => return Err(format!("message {n}'s content is not text")),
        };
        if role == "user" && !content.is_string() {
            return Err(format!("message {n} (user) has no text"));
        }
        let mut norm = serde_json::Map::new();
        norm.insert("role".into(), Value::String(role.into()));
        norm.insert("content".into(), content);
        for key in ["tool_calls", "tool_call_id", "name"] {
            if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
                norm.insert(key.into(), v.clone());
            }
        }
        out.push(Value::Object(norm));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv_rows(text: &str) -> Result<Vec<Fields>, ReadError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.csv");
        std::fs::write(&path, text).unwrap();
        let mut rows = Vec::new();
        let mut bad = None;
        Csv { tabs: false }.read(&path, &mut |_, fields| match fields {
            Ok(fields) => {
                rows.push(fields);
                ControlFlow::Continue(())
            }
            Err(e) => {
                bad.get_or_insert(e);
                ControlFlow::Break(())
            }
        })?;
        if let Some(e) = bad {
            return Err(e);
        }
        Ok(rows)
    }

    #[test]
    fn a_quote_left_open_is_an_error_and_a_closed_one_spanning_lines_is_not() {
        for closed in [
            "a,b\n1,\"two\nlines\"",
            "a,b\n1,\"two\nlines\"\r\n\n",
            "a,b\n1,\"two\nlines \"\"quoted\"\"\"\n",
            &format!("a,b\n1,\"two\nlines\"{}", "\n".repeat(5000)),
        ] {
            let rows = csv_rows(closed).unwrap();
            assert_eq!(rows.len(), 1, "{closed:?}");
        }
        let Err(ReadError::Row { row, column, .. }) = csv_rows("a,b\n0,x\n1,\"open\n2,y\n") else {
            panic!("an open quote read as rows");
        };
        assert_eq!((row, column.as_deref()), (2, Some("b")));
        // Opened in a middle column, the quote takes the rest of the file and leaves the
        // row short: the quote is named, not only the count of fields.
        let Err(ReadError::Row {
            row,
            column,
            message,
        }) = csv_rows("id,text,want\nr0,\"hello 0,hello 0\nr1,hello 1,hello 1\n")
        else {
            panic!("an open quote read as rows");
        };
        assert_eq!((row, column.as_deref()), (1, Some("text")));
        assert!(
            message.starts_with("line 2: a quote opened in this field runs on"),
            "{message}"
        );
        assert!(
            message.ends_with("2 fields where the header has 3"),
            "{message}"
        );
    }

    #[test]
    fn csv_fields_are_typed_only_when_they_read_back_the_same() {
        assert_eq!(csv_value("42"), Value::from(42));
        assert_eq!(csv_value("-1.5"), Value::from(-1.5));
        assert_eq!(csv_value("007"), Value::from("007"));
        assert_eq!(csv_value("1.50"), Value::from("1.50"));
        assert_eq!(csv_value("true"), Value::Bool(true));
        assert_eq!(csv_value(""), Value::from(""));
        assert_eq!(csv_value("NaN"), Value::from("NaN"));
        assert_eq!(csv_value("-0"), Value::from("-0"));
        // A whole float as polars and pandas write it, beside the column's others.
        assert_eq!(csv_value("10.0"), Value::from(10.0));
        assert_eq!(csv_value("11.25"), Value::from(11.25));
        assert_eq!(csv_value("10.00"), Value::from("10.00"));
    }

    #[test]
    fn content_ids_ignore_key_order() {
        let a: Fields = serde_json::from_str(r#"{"a":1,"b":{"x":1,"y":2}}"#).unwrap();
        let b: Fields = serde_json::from_str(r#"{"b":{"y":2,"x":1},"a":1}"#).unwrap();
        assert_eq!(content_id(&a), content_id(&b));
        let c: Fields = serde_json::from_str(r#"{"a":2,"b":{"x":1,"y":2}}"#).unwrap();
        assert_ne!(content_id(&a), content_id(&c));
        // A column another row brought in (`null` here) changes nothing.
        let filled: Fields = serde_json::from_str(r#"{"a":1,"b":{"x":1,"y":2},"z":null}"#).unwrap();
        assert_eq!(content_id(&a), content_id(&filled));
    }
}
