//! The Parquet tables: column buffers flushed in bounded batches through polars' Parquet
//! writer.
//!
//! Rows are appended to plain `Vec` column buffers; once a table holds `batch_rows` rows (or
//! roughly [`FLUSH_BYTES`] of text) the buffers become Arrow arrays (polars' own,
//! polars-arrow) that are written as a row group (their columns encoded by
//! [`crate::row_groups`]) and dropped. Memory therefore depends on the batch size, never on
//! the size of the journal. Each file is written as `NAME.parquet.partial` and renamed when
//! complete (see [`crate::staged`]). A table that cannot be written (disk full) stops taking
//! rows and reports why at the end; the other tables go on. Column names and types are
//! documented in `docs/results.md`.
//!
//! The arrays are those polars' frames would hold for the same columns, and the writer is the
//! one polars' own `ParquetWriter` hands a frame's arrays to, so the files are what polars
//! writes, except for the Arrow schema in their metadata ([`reader_schema`]); without frames
//! in between, the build and the binary leave out polars-core (docs/architecture.md,
//! docs/performance.md).

use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use polars_arrow::array::{Array, BooleanArray, ListArray, MutableBinaryViewArray, PrimitiveArray};
use polars_arrow::datatypes::{ArrowDataType, ArrowSchema, Field};
use polars_arrow::offset::Offsets;
use polars_arrow::types::Index;
use polars_error::{PolarsError, PolarsResult};
use polars_parquet::write::{CompressionOptions, FileWriter};
use trellis_records::{
    CriterionStatus, Fault, NodeRecord, RunInfo, RunSummary, SpanBatch, SpanRecord,
    TrajectoryRecord, TrajectoryStatus,
};

use crate::error::ReportError;
use crate::history::{RunMeta, SCHEMA_VERSION};
use crate::staged::{KeptIoError, Staged, kept_io_error};

/// Flush a table early when its buffered text reaches this size, so a run with very long
/// replies does not hold `batch_rows` of them at once. A batch is held about three times
/// over while it is written (the buffers, their arrays, the encoded pages): at 64 MiB, 150
/// turns of 8 MiB replies (an agent cut at its `max-response-size`) peaked at 498 MB, at 16
/// MiB at 240 MB, and took less time (6.5 → 4.6 s). Runs of ordinary replies flush by rows.
const FLUSH_BYTES: usize = 16 * 1024 * 1024;

/// The fewest rows a table writes as a row group while the run is quiet
/// ([`Tables::flush_quiet`]), and the share of its rows so far a row group must reach: row
/// groups never shrink below a few hundred rows, nor below an eighth of what came before,
/// so a long, often quiet run has a number of them logarithmic in its rows, up to the batches.
const QUIET_MIN_ROWS: usize = 256;
const QUIET_MIN_SHARE: usize = 8;

/// Snappy, not zstd: polars-parquet makes a new zstd context for every column chunk, and
/// zstd asks the CPU for its features (CPUID) each time, which traps to the hypervisor on a
/// VM (about 6 us, three times per context): 4 ms of a one-trajectory run's 13 ms went
/// there. Snappy is also what pandas writes; every reader reads it.
const COMPRESSION: CompressionOptions = CompressionOptions::Snappy;

/// The name polars (and pyarrow) give a list column's values.
const LIST_VALUES: &str = "item";

pub(crate) const TRAJECTORIES_FILE: &str = "trajectories.parquet";
pub(crate) const TURNS_FILE: &str = "turns.parquet";
pub(crate) const TOOL_CALLS_FILE: &str = "tool_calls.parquet";
pub(crate) const CRITERIA_FILE: &str = "criteria.parquet";
pub(crate) const RUBRIC_SCORES_FILE: &str = "rubric_scores.parquet";
pub(crate) const RUNS_FILE: &str = "runs.parquet";
pub(crate) const SPANS_FILE: &str = "spans.parquet";

/// A growable buffer for one column that becomes an Arrow array of the type polars gives
/// the same values (text is `Utf8View`, lists `LargeList`, every column nullable).
trait ColumnBuffer: Default {
    /// The column's type in the file.
    fn dtype() -> ArrowDataType;
    /// The buffered values as an array, leaving the buffer empty.
    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>>;
}

/// Numbers, handed over as the array's buffer.
macro_rules! number_buffer {
    ($($t:ty => $dtype:ident),* $(,)?) => {
        $(impl ColumnBuffer for Vec<$t> {
            fn dtype() -> ArrowDataType {
                ArrowDataType::$dtype
            }

            fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
                Ok(PrimitiveArray::from_vec(std::mem::take(self)).boxed())
            }
        })*
    };
}

number_buffer!(u32 => UInt32, u64 => UInt64, f64 => Float64);

/// Columns copied into arrays (strings into views, options into values and a validity
/// bitmap): the buffer is cleared instead of handed over, so the next batch fills the same
/// memory. Handed over, every batch grew new buffers from nothing, copying at each doubling
/// into pages never touched before: most of a 20,000-trajectory run's 18,800 page faults
/// were the reporter's.
macro_rules! optional_number_buffer {
    ($($t:ty => $dtype:ident),* $(,)?) => {
        $(impl ColumnBuffer for Vec<Option<$t>> {
            fn dtype() -> ArrowDataType {
                ArrowDataType::$dtype
            }

            fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
                let array: PrimitiveArray<$t> = self.iter().collect();
                self.clear();
                Ok(array.boxed())
            }
        })*
    };
}

optional_number_buffer!(u32 => UInt32, u64 => UInt64, f64 => Float64);

impl ColumnBuffer for Vec<String> {
    fn dtype() -> ArrowDataType {
        ArrowDataType::Utf8View
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let array = MutableBinaryViewArray::<str>::from_values_iter(self.iter()).freeze();
        self.clear();
        Ok(array.boxed())
    }
}

impl ColumnBuffer for Vec<Option<String>> {
    fn dtype() -> ArrowDataType {
        ArrowDataType::Utf8View
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let array =
            MutableBinaryViewArray::<str>::from_iter(self.iter().map(Option::as_deref)).freeze();
        self.clear();
        Ok(array.boxed())
    }
}

impl ColumnBuffer for Vec<bool> {
    fn dtype() -> ArrowDataType {
        ArrowDataType::Boolean
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let array = BooleanArray::from_slice(self.as_slice());
        self.clear();
        Ok(array.boxed())
    }
}

impl ColumnBuffer for Vec<Option<bool>> {
    fn dtype() -> ArrowDataType {
        ArrowDataType::Boolean
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let array: BooleanArray = self.iter().collect();
        self.clear();
        Ok(array.boxed())
    }
}

/// A column of names a run repeats on every row (its id, suites, scenarios, agents,
/// statuses, checks): a row holds the index of its name, so pushing one copies no string.
/// Cloning each name into each row was about 2,300 instructions a trajectory, and as much
/// again to free them. The names are kept from batch to batch: they are bounded by the
/// suites, not by the rows.
#[derive(Default)]
struct Names {
    rows: Vec<usize>,
    names: Vec<String>,
    index: std::collections::HashMap<String, usize, foldhash::fast::RandomState>,
}

impl Names {
    fn push(&mut self, name: &str) {
        // Most rows repeat the row before's name.
        let i = match self.rows.last() {
            Some(&last) if self.names[last] == name => last,
            _ => match self.index.get(name) {
                Some(&i) => i,
                None => {
                    self.names.push(name.to_owned());
                    self.index.insert(name.to_owned(), self.names.len() - 1);
                    self.names.len() - 1
                }
            },
        };
        self.rows.push(i);
    }
}

impl ColumnBuffer for Names {
    fn dtype() -> ArrowDataType {
        ArrowDataType::Utf8View
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let names = &self.names;
        let array = MutableBinaryViewArray::<str>::from_values_iter(
            self.rows.iter().map(|&i| names[i].as_str()),
        )
        .freeze();
        self.rows.clear();
        Ok(array.boxed())
    }
}

impl ColumnBuffer for Vec<Vec<String>> {
    fn dtype() -> ArrowDataType {
        ArrowDataType::LargeList(Box::new(Field::new(
            LIST_VALUES.into(),
            ArrowDataType::Utf8View,
            true,
        )))
    }

    fn take_array(&mut self) -> PolarsResult<Box<dyn Array>> {
        let offsets = Offsets::<i64>::try_from_lengths(self.iter().map(Vec::len))?;
        let mut values = MutableBinaryViewArray::<str>::with_capacity(offsets.last().to_usize());
        for list in self.drain(..) {
            for value in &list {
                values.push_value(value);
            }
        }
        let array = ListArray::<i64>::try_new(
            Self::dtype(),
            offsets.into(),
            values.freeze().boxed(),
            None,
        )?;
        Ok(array.boxed())
    }
}

/// Row buffers of one table.
trait Rows: Default {
    fn rows(&self) -> usize;
    fn bytes(&self) -> usize;
    /// The table's columns as they are written: every one nullable, as polars writes them.
    fn schema() -> ArrowSchema;
    /// Moves the buffered rows into arrays, one per column in [`Rows::schema`]'s order,
    /// leaving the buffers empty. Returns how many rows they hold.
    fn take_arrays(&mut self) -> PolarsResult<(usize, Vec<Box<dyn Array>>)>;
}

/// Declares a table's row buffer: one `Vec` per column, in file column order.
macro_rules! table {
    ($(#[doc = $doc:literal])* $name:ident { $($col:ident: $ty:ty),* $(,)? }) => {
        $(#[doc = $doc])*
        #[derive(Default)]
        struct $name {
            rows: usize,
            bytes: usize,
            $($col: $ty,)*
        }

        impl Rows for $name {
            fn rows(&self) -> usize {
                self.rows
            }

            fn bytes(&self) -> usize {
                self.bytes
            }

            fn schema() -> ArrowSchema {
                ArrowSchema::from_iter([$(Field::new(
                    stringify!($col).into(),
                    <$ty as ColumnBuffer>::dtype(),
                    true,
                ),)*])
            }

            fn take_arrays(&mut self) -> PolarsResult<(usize, Vec<Box<dyn Array>>)> {
                let height = std::mem::take(&mut self.rows);
                self.bytes = 0;
                Ok((height, vec![$(ColumnBuffer::take_array(&mut self.$col)?,)*]))
            }
        }
    };
}

table!(
    /// `trajectories.parquet`: one row per trajectory record.
    TrajectoryRows {
        run_id: Names,
        schema_version: Vec<u32>,
        suite: Names,
        scenario: Names,
        trajectory: Names,
        agent: Names,
        protocol: Names,
        repetition: Vec<u32>,
        status: Names,
        passed: Vec<bool>,
        turns: Vec<u32>,
        duration_ms: Vec<f64>,
        fault_category: Vec<Option<String>>,
        fault_message: Vec<Option<String>>,
        skip_reason: Vec<Option<String>>,
        nodes: Vec<Vec<String>>,
        tags: Vec<Vec<String>>,
        criteria_failed: Vec<u32>,
        checks_passed: Vec<u32>,
        checks_failed: Vec<u32>,
        checks_skipped: Vec<u32>,
        agent_branches: Vec<Option<String>>,
        awaiting_human: Vec<Option<String>>,
        sandbox_state: Vec<Option<String>>,
        llm_calls: Vec<u64>,
        llm_input_tokens: Vec<Option<u64>>,
        llm_output_tokens: Vec<Option<u64>>,
        llm_cost: Vec<Option<f64>>,
        llm_cache_hits: Vec<u64>,
        instance_of: Vec<Option<String>>,
        dataset: Vec<Option<String>>,
        row_id: Vec<Option<String>>,
        row: Vec<Option<String>>,
        matrix: Vec<Option<String>>,
        attack: Vec<Option<String>>,
    }
);

table!(
    /// `turns.parquet`: one row per agent turn of an execution node.
    TurnRows {
        run_id: Names,
        schema_version: Vec<u32>,
        suite: Names,
        scenario: Names,
        node: Names,
        agent: Names,
        repetition: Vec<u32>,
        turn_index: Vec<u32>,
        user_message: Vec<String>,
        reply: Vec<Option<String>>,
        latency_ms: Vec<f64>,
        ttft_ms: Vec<Option<f64>>,
        prompt_tokens: Vec<Option<u64>>,
        completion_tokens: Vec<Option<u64>>,
        total_tokens: Vec<Option<u64>>,
        tokens_partial: Vec<bool>,
        cost_usd: Vec<Option<f64>>,
        model: Vec<Option<String>>,
        provider: Vec<Option<String>>,
        attempts: Vec<u32>,
        tool_calls: Vec<u32>,
        started_ms: Vec<f64>,
        ended_ms: Vec<f64>,
        fault_category: Vec<Option<String>>,
        fault_message: Vec<Option<String>>,
        parent_node: Vec<Option<String>>,
        messages: Vec<String>,
        kind: Names,
        function: Vec<Option<String>>,
        replay: Vec<bool>,
        exchanges: Vec<String>,
        user_source: Vec<Option<String>>,
        simulator_calls: Vec<u32>,
        simulator_input_tokens: Vec<Option<u64>>,
        simulator_output_tokens: Vec<Option<u64>>,
        simulator_cost: Vec<Option<f64>>,
        simulator_cache_hit: Vec<Option<bool>>,
        trace_id: Vec<Option<String>>,
        span_id: Vec<Option<String>>,
        spans: Vec<u32>,
        agent_metadata: Vec<Option<String>>,
    }
);

table!(
    /// `tool_calls.parquet`: one row per tool call of a turn.
    ToolCallRows {
        run_id: Vec<String>,
        schema_version: Vec<u32>,
        suite: Vec<String>,
        scenario: Vec<String>,
        node: Vec<String>,
        agent: Vec<String>,
        repetition: Vec<u32>,
        turn_index: Vec<u32>,
        call_index: Vec<u32>,
        call_id: Vec<String>,
        name: Vec<String>,
        arguments: Vec<String>,
        result: Vec<Option<String>>,
        replay: Vec<bool>,
    }
);

table!(
    /// `criteria.parquet`: one row per check of a trajectory.
    CriterionRows {
        run_id: Names,
        schema_version: Vec<u32>,
        suite: Names,
        scenario: Names,
        trajectory: Names,
        agent: Names,
        repetition: Vec<u32>,
        turn_index: Vec<Option<u32>>,
        criterion: Names,
        kind: Names,
        status: Names,
        passed: Vec<bool>,
        detail: Vec<Option<String>>,
        judge: Vec<Option<String>>,
        judge_provider: Vec<Option<String>>,
        judge_model: Vec<Option<String>>,
        rubric: Vec<Option<String>>,
        score: Vec<Option<f64>>,
        threshold: Vec<Option<f64>>,
        label: Vec<Option<String>>,
        justification: Vec<Option<String>>,
        judge_input_tokens: Vec<Option<u64>>,
        judge_output_tokens: Vec<Option<u64>>,
        judge_cost: Vec<Option<f64>>,
        judge_cache_hit: Vec<Option<bool>>,
        consensus: Vec<Option<String>>,
        agreement: Vec<Option<f64>>,
        judge_error_category: Vec<Option<String>>,
    }
);

table!(
    /// `rubric_scores.parquet`: one row per metric of a judged check scored on a
    /// multi-metric rubric (Connexity's eight metrics).
    RubricScoreRows {
        run_id: Vec<String>,
        schema_version: Vec<u32>,
        suite: Vec<String>,
        scenario: Vec<String>,
        trajectory: Vec<String>,
        agent: Vec<String>,
        repetition: Vec<u32>,
        turn_index: Vec<Option<u32>>,
        criterion: Vec<String>,
        judge: Vec<String>,
        rubric: Vec<String>,
        metric: Vec<String>,
        weight: Vec<f64>,
        score: Vec<f64>,
        label: Vec<Option<String>>,
        justification: Vec<Option<String>>,
        failure_code: Vec<Option<String>>,
    }
);

table!(
    /// `spans.parquet`: one row per OpenTelemetry span an agent reported for a turn.
    SpanRows {
        run_id: Vec<String>,
        schema_version: Vec<u32>,
        suite: Vec<String>,
        scenario: Vec<String>,
        node: Vec<String>,
        agent: Vec<String>,
        repetition: Vec<u32>,
        turn_index: Vec<u32>,
        trace_id: Vec<String>,
        span_id: Vec<String>,
        parent_span_id: Vec<Option<String>>,
        name: Vec<String>,
        kind: Vec<String>,
        start_unix_nano: Vec<u64>,
        end_unix_nano: Vec<u64>,
        duration_ms: Vec<f64>,
        status: Vec<String>,
        status_message: Vec<Option<String>>,
        service: Vec<Option<String>>,
        attributes: Vec<String>,
        late: Vec<bool>,
    }
);

table!(
    /// `runs.parquet`: one row per run.
    RunRows {
        run_id: Vec<String>,
        schema_version: Vec<u32>,
        started_at: Vec<String>,
        finished_at: Vec<Option<String>>,
        trellis_version: Vec<String>,
        duration_ms: Vec<Option<f64>>,
        trajectories: Vec<u64>,
        passed: Vec<u64>,
        failed: Vec<u64>,
        errors: Vec<u64>,
        skipped: Vec<u64>,
        invalid: Vec<u64>,
        turns: Vec<u64>,
        planned_trajectories: Vec<u64>,
        interrupted: Vec<bool>,
        suites: Vec<Vec<String>>,
        suite_fingerprint: Vec<Option<String>>,
        git_commit: Vec<Option<String>>,
        git_dirty: Vec<Option<bool>>,
        endpoints: Vec<Vec<String>>,
        tags: Vec<Vec<String>>,
        labels: Vec<Vec<String>>,
        rejudged_from: Vec<Option<String>>,
        kind: Vec<String>,
        strict: Vec<bool>,
    }
);

/// What polars' `ParquetWriter` writes with by default, and [`COMPRESSION`].
fn write_options() -> polars_parquet::write::WriteOptions {
    polars_parquet::write::WriteOptions {
        statistics: polars_parquet::write::StatisticsOptions::default(),
        version: polars_parquet::write::Version::V1,
        compression: COMPRESSION,
        data_page_size: None,
    }
}

/// The Arrow schema the file's metadata carries (`ARROW:schema`), which pyarrow (and
/// pandas through it) reads the columns as: text as `large_string`, not polars' in-memory
/// `string_view`, which pandas cannot convert inside a list and pyarrow's compute functions
/// (filter, sort, join keys) refuse. The Parquet columns are the same either way, and polars
/// reads both as its `String`.
fn reader_schema(schema: &ArrowSchema) -> polars_parquet::write::KeyValue {
    fn plain(dtype: &ArrowDataType) -> ArrowDataType {
        match dtype {
            ArrowDataType::Utf8View => ArrowDataType::LargeUtf8,
            ArrowDataType::BinaryView => ArrowDataType::LargeBinary,
            ArrowDataType::LargeList(field) => ArrowDataType::LargeList(Box::new(Field {
                dtype: plain(&field.dtype),
                ..(**field).clone()
            })),
            ArrowDataType::Struct(fields) => ArrowDataType::Struct(
                fields
                    .iter()
                    .map(|f| Field {
                        dtype: plain(&f.dtype),
                        ..f.clone()
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let schema: ArrowSchema = schema
        .iter_values()
        .map(|f| {
            let field = Field {
                dtype: plain(&f.dtype),
                ..f.clone()
            };
            (field.name.clone(), field)
        })
        .collect();
    polars_parquet::write::schema_to_metadata_key(&schema)
}

/// What a Parquet write's error was: the I/O error under it, if the file met one.
fn write_error(first: &OnceLock<io::Error>, path: &Path, source: PolarsError) -> ReportError {
    match kept_io_error(first) {
        Some(e) => ReportError::io("write", path, e),
        None => ReportError::Polars {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// One Parquet file being written batch by batch.
struct TableFile<R: Rows> {
    staged: Staged,
    buf: R,
    writer: FileWriter<KeptIoError>,
    /// The first I/O error the writer met: said instead of what the writer made of it.
    io_error: Arc<OnceLock<io::Error>>,
    batch_rows: usize,
    /// Rows written as row groups so far.
    written: usize,
    /// The first write error; from then on rows are dropped and [`TableFile::finish`]
    /// returns it.
    failed: Option<ReportError>,
}

impl<R: Rows> TableFile<R> {
    fn create(dir: &Path, name: &str, batch_rows: usize) -> Result<Self, ReportError> {
        let (staged, file) = Staged::create(&dir.join(name))?;
        // The schema is the table's own, so a table that never gets a row is still a valid
        // file with the right columns.
        let io_error = Arc::new(OnceLock::new());
        let file = KeptIoError {
            file: BufWriter::new(file),
            first: io_error.clone(),
        };
        let writer = FileWriter::try_new(file, R::schema(), write_options())
            .map_err(|source| write_error(&io_error, &staged.path, source))?;
        Ok(TableFile {
            staged,
            buf: R::default(),
            writer,
            io_error,
            batch_rows: batch_rows.max(1),
            written: 0,
            failed: None,
        })
    }

    /// Writes what is buffered as a row group if it is large enough for one written while
    /// the run is quiet ([`QUIET_MIN_ROWS`], [`QUIET_MIN_SHARE`]).
    fn flush_quiet(&mut self) {
        let rows = self.buf.rows();
        if self.failed.is_none() && rows >= QUIET_MIN_ROWS.max(self.written / QUIET_MIN_SHARE) {
            self.failed = self.flush().err();
        }
    }

    /// Called after each appended row: writes a row group when the batch is full.
    fn row_done(&mut self) {
        if self.failed.is_some() {
            // Nothing more reaches this file; keep memory flat.
            self.buf = R::default();
        } else if self.buf.rows() >= self.batch_rows || self.buf.bytes() >= FLUSH_BYTES {
            self.failed = self.flush().err();
        }
    }

    fn flush(&mut self) -> Result<(), ReportError> {
        if self.buf.rows() == 0 {
            return Ok(());
        }
        let (rows, arrays) = self
            .buf
            .take_arrays()
            .map_err(|source| ReportError::Polars {
                path: self.staged.path.clone(),
                source,
            })?;
        self.written += rows;
        crate::row_groups::write(&mut self.writer, rows, &arrays, write_options())
            .map_err(|source| write_error(&self.io_error, &self.staged.path, source))
    }

    /// The path of the finished file, or why it could not be written.
    fn finish(mut self) -> Result<PathBuf, (PathBuf, ReportError)> {
        let path = self.staged.path.clone();
        if let Some(e) = self.failed.take() {
            return Err((path, e));
        }
        let written = self.flush().and_then(|()| {
            // Writes the footer and flushes the file's buffer (an error of either is the
            // writer's), then closes the file before the rename.
            self.writer
                .end(Some(vec![reader_schema(&R::schema())]))
                .map_err(|source| write_error(&self.io_error, &path, source))?;
            drop(self.writer);
            self.staged.publish()
        });
        written.map_err(|e| (path, e))
    }
}

/// Totals of one run for `runs.parquet`.
pub(crate) struct RunRow<'a> {
    pub(crate) info: &'a RunInfo,
    pub(crate) finished: Option<&'a RunSummary>,
    pub(crate) trajectories: u64,
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) errors: u64,
    pub(crate) skipped: u64,
    /// The simulated user broke character: with the four counts above, they add up to
    /// `trajectories`.
    pub(crate) invalid: u64,
    pub(crate) turns: u64,
    /// `run.json`, when the run has one.
    pub(crate) meta: Option<&'a RunMeta>,
}

/// Paths of the tables, whether written or not.
pub(crate) struct TablePaths {
    pub(crate) trajectories: PathBuf,
    pub(crate) turns: PathBuf,
    pub(crate) tool_calls: PathBuf,
    pub(crate) criteria: PathBuf,
    pub(crate) rubric_scores: PathBuf,
    pub(crate) runs: PathBuf,
    pub(crate) spans: PathBuf,
}

/// Per `(suite, scenario)` of a `for-each` / `matrix` instance: its `instance_of`,
/// `dataset`, `row_id`, `row` (JSON) and `matrix` (JSON) columns.
type InstanceColumns = [Option<String>; 5];

/// A map hashed with foldhash: its keys are names from the suites, not an attacker's.
type Hashed<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// All six tables of one run.
pub(crate) struct Tables {
    run_id: String,
    /// By suite, then scenario: a trajectory's names find its columns as they are, where a
    /// key of both copied them for every trajectory (and hashed them with SipHash).
    instances: Hashed<String, Hashed<String, InstanceColumns>>,
    trajectories: TableFile<TrajectoryRows>,
    turns: TableFile<TurnRows>,
    tool_calls: TableFile<ToolCallRows>,
    criteria: TableFile<CriterionRows>,
    rubric_scores: TableFile<RubricScoreRows>,
    runs: TableFile<RunRows>,
    spans: TableFile<SpanRows>,
}

fn fault_parts(fault: Option<&Fault>) -> (Option<String>, Option<String>) {
    match fault {
        Some(f) => (
            Some(f.category.as_str().to_owned()),
            Some(f.message.clone()),
        ),
        None => (None, None),
    }
}

/// The turn a span row belongs to.
struct SpanKey<'a> {
    suite: &'a str,
    scenario: &'a str,
    node: &'a str,
    agent: &'a str,
    repetition: u32,
    turn_index: u32,
    /// Arrived after the turn was recorded.
    late: bool,
}

fn opt_len(s: Option<&String>) -> usize {
    s.map_or(0, String::len)
}

impl Tables {
    pub(crate) fn create(dir: &Path, run_id: &str, batch_rows: usize) -> Result<Self, ReportError> {
        Ok(Tables {
            run_id: run_id.to_owned(),
            instances: Hashed::default(),
            trajectories: TableFile::create(dir, TRAJECTORIES_FILE, batch_rows)?,
            turns: TableFile::create(dir, TURNS_FILE, batch_rows)?,
            tool_calls: TableFile::create(dir, TOOL_CALLS_FILE, batch_rows)?,
            criteria: TableFile::create(dir, CRITERIA_FILE, batch_rows)?,
            rubric_scores: TableFile::create(dir, RUBRIC_SCORES_FILE, batch_rows)?,
            runs: TableFile::create(dir, RUNS_FILE, batch_rows)?,
            spans: TableFile::create(dir, SPANS_FILE, batch_rows)?,
        })
    }

    /// The planned scenarios that are instances of `for-each` / `matrix` scenarios: their
    /// trajectories carry the dataset, row id, row and matrix values, so results join back
    /// to the source rows.
    pub(crate) fn set_instances(&mut self, scenarios: &[trellis_records::ScenarioInfo]) {
        let json = |v: &serde_json::Map<String, serde_json::Value>| serde_json::to_string(v).ok();
        // Each suite's map sized for its instances at once: grown from empty, a dataset of
        // 100,000 rows rehashed it 17 times.
        let mut per_suite: Hashed<&str, usize> = Hashed::default();
        for s in scenarios.iter().filter(|s| s.instance.is_some()) {
            *per_suite.entry(s.suite.as_str()).or_default() += 1;
        }
        for (suite, count) in per_suite {
            if !self.instances.contains_key(suite) {
                let map = Hashed::with_capacity_and_hasher(count, Default::default());
                self.instances.insert(suite.to_owned(), map);
            }
        }
        for s in scenarios {
            let Some(i) = &s.instance else { continue };
            let Some(of_suite) = self.instances.get_mut(s.suite.as_str()) else {
                continue;
            };
            let matrix = (!i.vars.is_empty()).then(|| json(&i.vars)).flatten();
            of_suite.insert(
                s.scenario.clone(),
                [
                    Some(i.of.clone()),
                    i.dataset.clone(),
                    i.row_id.clone(),
                    i.row.as_deref().and_then(json),
                    matrix,
                ],
            );
        }
    }

    pub(crate) fn push_node(&mut self, node: &NodeRecord) {
        for turn in &node.turns {
            let t = &mut self.turns.buf;
            let (fault_category, fault_message) = fault_parts(turn.fault.as_ref());
            // Serialising plain structs to a Vec cannot fail; an empty array is the
            // harmless fallback if it ever did.
            let messages =
                serde_json::to_string(&turn.messages).unwrap_or_else(|_| "[]".to_owned());
            let exchanges =
                serde_json::to_string(&turn.exchanges).unwrap_or_else(|_| "[]".to_owned());
            let agent_metadata = turn.metadata.as_ref().map(serde_json::Value::to_string);
            t.bytes += turn.user_message.len()
                + opt_len(turn.reply.as_ref())
                + opt_len(fault_message.as_ref())
                + opt_len(agent_metadata.as_ref())
                + messages.len()
                + exchanges.len();
            t.schema_version.push(SCHEMA_VERSION);
            t.run_id.push(&self.run_id);
            t.suite.push(&node.suite);
            t.scenario.push(&node.scenario);
            t.node.push(&node.node);
            t.agent.push(&node.agent);
            t.repetition.push(node.repetition);
            t.turn_index.push(turn.turn_index);
            t.user_message.push(turn.user_message.clone());
            t.reply.push(turn.reply.clone());
            t.latency_ms.push(turn.latency_ms);
            t.ttft_ms.push(turn.ttft_ms);
            t.prompt_tokens.push(turn.prompt_tokens);
            t.completion_tokens.push(turn.completion_tokens);
            t.total_tokens.push(turn.total_tokens);
            t.tokens_partial.push(turn.tokens_partial);
            t.cost_usd.push(turn.cost_usd);
            t.model.push(turn.model.clone());
            t.provider.push(turn.provider.clone());
            t.attempts.push(turn.attempts);
            t.tool_calls
                .push(u32::try_from(turn.tool_calls.len()).unwrap_or(u32::MAX));
            t.started_ms.push(turn.started_ms);
            t.ended_ms.push(turn.end_ms());
            t.fault_category.push(fault_category);
            t.fault_message.push(fault_message);
            t.parent_node.push(node.parent.clone());
            t.messages.push(messages);
            t.kind.push(&turn.kind);
            t.function.push(turn.function.clone());
            t.replay.push(turn.replay);
            t.exchanges.push(exchanges);
            t.user_source
                .push(turn.user_source.map(|s| s.as_str().to_owned()));
            let calls = &turn.simulator;
            let sum = |f: fn(&trellis_records::LlmCall) -> Option<u64>| {
                calls.iter().filter_map(f).reduce(u64::saturating_add)
            };
            t.simulator_calls
                .push(u32::try_from(calls.len()).unwrap_or(u32::MAX));
            t.simulator_input_tokens.push(sum(|c| c.input_tokens));
            t.simulator_output_tokens.push(sum(|c| c.output_tokens));
            t.simulator_cost
                .push(calls.iter().filter_map(|c| c.cost).reduce(|a, b| a + b));
            t.simulator_cache_hit.push((!calls.is_empty()).then(|| {
                calls
                    .iter()
                    .all(|c| c.cache == trellis_records::CacheUse::Hit)
            }));
            t.trace_id.push(turn.trace_id.as_deref().map(str::to_owned));
            t.span_id.push(turn.span_id.clone());
            t.spans
                .push(u32::try_from(turn.spans.len()).unwrap_or(u32::MAX));
            t.agent_metadata.push(agent_metadata);
            t.rows += 1;
            self.turns.row_done();

            for (call_index, call) in turn.tool_calls.iter().enumerate() {
                let c = &mut self.tool_calls.buf;
                c.bytes += call.arguments.len() + opt_len(call.result.as_ref());
                c.schema_version.push(SCHEMA_VERSION);
                c.run_id.push(self.run_id.clone());
                c.suite.push(node.suite.clone());
                c.scenario.push(node.scenario.clone());
                c.node.push(node.node.clone());
                c.agent.push(node.agent.clone());
                c.repetition.push(node.repetition);
                c.turn_index.push(turn.turn_index);
                c.call_index
                    .push(u32::try_from(call_index).unwrap_or(u32::MAX));
                c.call_id.push(call.call_id.clone());
                c.name.push(call.name.clone());
                c.arguments.push(call.arguments.clone());
                c.result.push(call.result.clone());
                c.replay.push(turn.replay);
                c.rows += 1;
                self.tool_calls.row_done();
            }
            let key = SpanKey {
                suite: &node.suite,
                scenario: &node.scenario,
                node: &node.node,
                agent: &node.agent,
                repetition: node.repetition,
                turn_index: turn.turn_index,
                late: false,
            };
            self.push_span_rows(&key, &turn.spans);
        }
    }

    /// Spans that arrived after their turn was recorded (the journal's `spans` entries).
    pub(crate) fn push_spans(&mut self, batch: &SpanBatch) {
        let key = SpanKey {
            suite: &batch.suite,
            scenario: &batch.scenario,
            node: &batch.node,
            agent: &batch.agent,
            repetition: batch.repetition,
            turn_index: batch.turn_index,
            late: true,
        };
        self.push_span_rows(&key, &batch.spans);
    }

    fn push_span_rows(&mut self, key: &SpanKey<'_>, spans: &[SpanRecord]) {
        for span in spans {
            let s = &mut self.spans.buf;
            // A map of plain JSON values always serialises.
            let attributes =
                serde_json::to_string(&span.attributes).unwrap_or_else(|_| "{}".to_owned());
            s.bytes += attributes.len() + span.name.len();
            s.run_id.push(self.run_id.clone());
            s.schema_version.push(SCHEMA_VERSION);
            s.suite.push(key.suite.to_owned());
            s.scenario.push(key.scenario.to_owned());
            s.node.push(key.node.to_owned());
            s.agent.push(key.agent.to_owned());
            s.repetition.push(key.repetition);
            s.turn_index.push(key.turn_index);
            s.trace_id.push(span.trace_id.clone());
            s.span_id.push(span.span_id.clone());
            s.parent_span_id.push(span.parent_span_id.clone());
            s.name.push(span.name.clone());
            s.kind.push(span.kind.clone());
            s.start_unix_nano.push(span.start_unix_nano);
            s.end_unix_nano.push(span.end_unix_nano);
            s.duration_ms.push(span.duration_ms());
            s.status.push(span.status.clone());
            s.status_message.push(span.status_message.clone());
            s.service.push(span.service.clone());
            s.attributes.push(attributes);
            s.late.push(key.late);
            s.rows += 1;
            self.spans.row_done();
        }
    }

    pub(crate) fn push_trajectory(&mut self, tr: &TrajectoryRecord) {
        let (fault_category, fault_message) = fault_parts(tr.fault.as_ref());
        let count =
            |status: CriterionStatus| u32::try_from(tr.checks_with(status)).unwrap_or(u32::MAX);
        let checks_failed = count(CriterionStatus::Failed);
        let t = &mut self.trajectories.buf;
        t.bytes += opt_len(fault_message.as_ref()) + opt_len(tr.skip_reason.as_ref());
        t.schema_version.push(SCHEMA_VERSION);
        t.run_id.push(&self.run_id);
        t.suite.push(&tr.suite);
        t.scenario.push(&tr.scenario);
        t.trajectory.push(&tr.trajectory);
        t.agent.push(&tr.agent);
        t.protocol.push(&tr.protocol);
        t.repetition.push(tr.repetition);
        t.status.push(tr.status.as_str());
        t.passed.push(tr.status == TrajectoryStatus::Passed);
        t.turns.push(tr.turns);
        t.duration_ms.push(tr.duration_ms);
        t.fault_category.push(fault_category);
        t.fault_message.push(fault_message);
        t.skip_reason.push(tr.skip_reason.clone());
        t.nodes.push(tr.nodes.clone());
        t.tags.push(tr.tags.clone());
        t.criteria_failed.push(checks_failed);
        t.checks_passed.push(count(CriterionStatus::Passed));
        t.checks_failed.push(checks_failed);
        t.checks_skipped.push(count(CriterionStatus::Skipped));
        let agent_branches = (!tr.agent_branches.is_empty())
            .then(|| serde_json::to_string(&tr.agent_branches).ok())
            .flatten();
        let sandbox_state = tr.sandbox_state.as_ref().map(|state| state.to_string());
        t.bytes += opt_len(agent_branches.as_ref())
            + opt_len(sandbox_state.as_ref())
            + opt_len(tr.awaiting_human.as_ref());
        t.agent_branches.push(agent_branches);
        t.awaiting_human.push(tr.awaiting_human.clone());
        t.sandbox_state.push(sandbox_state);
        let llm = tr.llm.as_deref().copied().unwrap_or_default();
        t.llm_calls.push(llm.calls);
        t.llm_input_tokens
            .push(tr.llm.as_deref().map(|u| u.input_tokens));
        t.llm_output_tokens
            .push(tr.llm.as_deref().map(|u| u.output_tokens));
        t.llm_cost.push(llm.cost);
        t.llm_cache_hits.push(llm.cache_hits);
        let [instance_of, dataset, row_id, row, matrix] = self
            .instances
            .get(tr.suite.as_str())
            .and_then(|of_suite| of_suite.get(tr.scenario.as_str()))
            .cloned()
            .unwrap_or_default();
        t.bytes += opt_len(row.as_ref());
        t.instance_of.push(instance_of);
        t.dataset.push(dataset);
        t.row_id.push(row_id);
        t.row.push(row);
        t.matrix.push(matrix);
        let attack = tr
            .attack
            .as_deref()
            .and_then(|a| serde_json::to_string(a).ok());
        t.bytes += opt_len(attack.as_ref());
        t.attack.push(attack);
        t.rows += 1;
        self.trajectories.row_done();

        for criterion in &tr.criteria {
            let c = &mut self.criteria.buf;
            c.bytes += criterion.criterion.len() + opt_len(criterion.detail.as_ref());
            c.schema_version.push(SCHEMA_VERSION);
            c.run_id.push(&self.run_id);
            c.suite.push(&tr.suite);
            c.scenario.push(&tr.scenario);
            c.trajectory.push(&tr.trajectory);
            c.agent.push(&tr.agent);
            c.repetition.push(tr.repetition);
            c.turn_index.push(criterion.turn_index);
            c.criterion.push(&criterion.criterion);
            c.kind.push(&criterion.kind);
            c.status.push(criterion.status.as_str());
            c.passed.push(criterion.status == CriterionStatus::Passed);
            c.detail.push(criterion.detail.clone());
            let judged = criterion.judge.as_deref();
            c.bytes += judged.map_or(0, |j| {
                j.judge.len() + opt_len(j.justification.as_ref()) + opt_len(j.label.as_ref())
            });
            c.judge.push(judged.map(|j| j.judge.clone()));
            c.judge_provider
                .push(judged.map(|j| j.call.provider.clone()));
            c.judge_model.push(judged.map(|j| j.call.model.clone()));
            // A judge that could not be set up has no rubric: null, not "".
            c.rubric
                .push(judged.map(|j| j.rubric.clone()).filter(|r| !r.is_empty()));
            c.score.push(judged.and_then(|j| j.score));
            c.threshold.push(judged.map(|j| j.threshold));
            c.label.push(judged.and_then(|j| j.label.clone()));
            c.justification
                .push(judged.and_then(|j| j.justification.clone()));
            c.judge_input_tokens
                .push(judged.and_then(|j| j.call.input_tokens));
            c.judge_output_tokens
                .push(judged.and_then(|j| j.call.output_tokens));
            c.judge_cost.push(judged.and_then(|j| j.call.cost));
            c.judge_cache_hit
                .push(judged.map(|j| j.call.cache == trellis_records::CacheUse::Hit));
            c.consensus.push(judged.and_then(|j| j.consensus.clone()));
            c.agreement.push(judged.and_then(|j| j.agreement));
            c.judge_error_category
                .push(judged.and_then(|j| j.error_category.clone()));
            c.rows += 1;
            self.criteria.row_done();

            for m in judged.map(|j| j.metrics.as_slice()).unwrap_or_default() {
                let r = &mut self.rubric_scores.buf;
                r.bytes +=
                    m.metric.len() + opt_len(m.justification.as_ref()) + opt_len(m.label.as_ref());
                r.run_id.push(self.run_id.clone());
                r.schema_version.push(SCHEMA_VERSION);
                r.suite.push(tr.suite.clone());
                r.scenario.push(tr.scenario.clone());
                r.trajectory.push(tr.trajectory.clone());
                r.agent.push(tr.agent.clone());
                r.repetition.push(tr.repetition);
                r.turn_index.push(criterion.turn_index);
                r.criterion.push(criterion.criterion.clone());
                r.judge
                    .push(judged.map(|j| j.judge.clone()).unwrap_or_default());
                r.rubric
                    .push(judged.map(|j| j.rubric.clone()).unwrap_or_default());
                r.metric.push(m.metric.clone());
                r.weight.push(m.weight);
                r.score.push(m.score);
                r.label.push(m.label.clone());
                r.justification.push(m.justification.clone());
                r.failure_code.push(m.failure_code.clone());
                r.rows += 1;
                self.rubric_scores.row_done();
            }
        }
    }

    /// Writes the rows buffered so far, table by table, where there are enough of them for
    /// a row group: called while the run is quiet (waiting on its agents), so that the end of
    /// the run has only the last rows left to encode instead of a whole batch of each table.
    pub(crate) fn flush_quiet(&mut self) {
        self.trajectories.flush_quiet();
        self.turns.flush_quiet();
        self.tool_calls.flush_quiet();
        self.criteria.flush_quiet();
        self.rubric_scores.flush_quiet();
        self.spans.flush_quiet();
    }

    /// Adds the run row, and hands every file over to be ended ([`TablesEnd`]).
    pub(crate) fn finish(mut self, run: RunRow<'_>) -> TablesEnd {
        let r = &mut self.runs.buf;
        r.schema_version.push(SCHEMA_VERSION);
        r.run_id.push(run.info.run_id.clone());
        r.started_at.push(run.info.started_at.clone());
        r.finished_at
            .push(run.finished.map(|s| s.finished_at.clone()));
        r.trellis_version.push(run.info.trellis_version.clone());
        r.duration_ms.push(run.finished.map(|s| s.duration_ms));
        r.trajectories.push(run.trajectories);
        r.passed.push(run.passed);
        r.failed.push(run.failed);
        r.errors.push(run.errors);
        r.skipped.push(run.skipped);
        r.invalid.push(run.invalid);
        r.turns.push(run.turns);
        r.planned_trajectories.push(run.info.planned_trajectories);
        r.interrupted
            .push(run.finished.is_some_and(|s| s.interrupted));
        r.suites.push(run.info.suites.clone());
        let meta = run.meta;
        r.suite_fingerprint.push(
            meta.map(|m| m.suite_fingerprint.clone())
                .filter(|f| !f.is_empty()),
        );
        let git = meta.and_then(|m| m.git.as_ref());
        r.git_commit.push(git.map(|g| g.commit.clone()));
        r.git_dirty.push(git.map(|g| g.dirty));
        r.endpoints.push(
            meta.map(|m| {
                m.endpoints
                    .iter()
                    .map(|e| format!("{}={}", e.agent, e.endpoint))
                    .collect()
            })
            .unwrap_or_default(),
        );
        r.tags
            .push(meta.map(|m| m.tags.clone()).unwrap_or_default());
        r.labels
            .push(meta.map(RunMeta::label_pairs).unwrap_or_default());
        r.rejudged_from.push(run.info.rejudged_from.clone());
        let rejudged = run.info.rejudged_from.is_some();
        r.kind.push(
            meta.map_or(if rejudged { "rejudge" } else { "run" }, |m| {
                m.kind(rejudged)
            })
            .to_owned(),
        );
        r.strict.push(run.info.strict);
        r.rows += 1;

        let paths = [
            self.trajectories.staged.path.clone(),
            self.turns.staged.path.clone(),
            self.tool_calls.staged.path.clone(),
            self.criteria.staged.path.clone(),
            self.rubric_scores.staged.path.clone(),
            self.runs.staged.path.clone(),
            self.spans.staged.path.clone(),
        ];
        let Tables {
            trajectories,
            turns,
            tool_calls,
            criteria,
            rubric_scores,
            runs,
            spans,
            ..
        } = self;
        // Taken from the end: the tables that usually hold the most rows go first, so that
        // two threads sharing them end close together.
        let jobs: Vec<(usize, TableJob)> = vec![
            (RUNS, Box::new(move || runs.finish())),
            (SPANS, Box::new(move || spans.finish())),
            (RUBRIC_SCORES, Box::new(move || rubric_scores.finish())),
            (TOOL_CALLS, Box::new(move || tool_calls.finish())),
            (TRAJECTORIES, Box::new(move || trajectories.finish())),
            (CRITERIA, Box::new(move || criteria.finish())),
            (TURNS, Box::new(move || turns.finish())),
        ];
        TablesEnd {
            jobs: Mutex::new(jobs),
            done: Mutex::new(std::array::from_fn(|_| None)),
            paths,
        }
    }
}

/// One table file's last rows, footer and move into place.
type TableJob = Box<dyn FnOnce() -> TableWritten + Send>;

/// A table file where it was written, or where it was to be and why it is not.
type TableWritten = Result<PathBuf, (PathBuf, ReportError)>;

/// The tables in [`TablesEnd`]'s slots.
const TRAJECTORIES: usize = 0;
const TURNS: usize = 1;
const TOOL_CALLS: usize = 2;
const CRITERIA: usize = 3;
const RUBRIC_SCORES: usize = 4;
const RUNS: usize = 5;
const SPANS: usize = 6;

/// The end of the tables, a file at a time, for any thread to take a share of
/// ([`TablesEnd::help`]). At the end of a run the pages are written beside the tables, and
/// the thread writing them takes what is left of the tables once they are done: the end of
/// a 2,000-trajectory run held 5 ms of tables against 2 of pages, one core idle for 3 of
/// them.
pub(crate) struct TablesEnd {
    /// The files not yet taken, by slot.
    jobs: Mutex<Vec<(usize, TableJob)>>,
    done: Mutex<[Option<TableWritten>; 7]>,
    /// Where each file goes, to name one whose thread panicked.
    paths: [PathBuf; 7],
}

impl TablesEnd {
    /// Ends files until none is left to take; some may still be being ended by other threads.
    pub(crate) fn help(&self) {
        loop {
            let job = match self.jobs.lock() {
                Ok(mut jobs) => jobs.pop(),
                Err(poisoned) => poisoned.into_inner().pop(),
            };
            let Some((slot, job)) = job else {
                return;
            };
            let written = job();
            match self.done.lock() {
                Ok(mut done) => done[slot] = Some(written),
                Err(poisoned) => poisoned.into_inner()[slot] = Some(written),
            }
        }
    }

    /// The files' paths and the ones not written, once every thread that helped is done.
    pub(crate) fn finish(self) -> (TablePaths, Vec<(PathBuf, ReportError)>) {
        // Whatever no thread took (none could be started) is ended now.
        self.help();
        let done = self
            .done
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut failed = Vec::new();
        let mut paths = self.paths.into_iter();
        let [
            trajectories,
            turns,
            tool_calls,
            criteria,
            rubric_scores,
            runs,
            spans,
        ] = done.map(|written| {
            let path = paths.next().unwrap_or_default();
            // Only a thread that took it and then panicked leaves a slot empty, and its
            // panic is resumed where it is joined.
            let written = written.unwrap_or_else(|| {
                let e = io::Error::other("the table was lost by the thread writing it");
                Err((path.clone(), ReportError::io("write", &path, e)))
            });
            match written {
                Ok(path) => path,
                Err((path, e)) => {
                    failed.push((path.clone(), e));
                    path
                }
            }
        });
        let paths = TablePaths {
            trajectories,
            turns,
            tool_calls,
            criteria,
            rubric_scores,
            runs,
            spans,
        };
        (paths, failed)
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use polars_arrow::array::Utf8ViewArray;

    use super::*;

    /// The footer and the bytes still buffered are written and flushed when a table ends,
    /// and an error there (a full disk) is returned for the table to report, not lost.
    #[test]
    fn a_table_file_that_cannot_be_ended_says_why() {
        let full = File::options()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full opens for writing");
        let one_column =
            ArrowSchema::from_iter([Field::new("run_id".into(), ArrowDataType::Utf8View, true)]);
        // A footer this small stays in the buffer until the end's flush.
        let mut writer = FileWriter::try_new(BufWriter::new(full), one_column, write_options())
            .expect("a writer over a buffer");
        let error = writer.end(None).expect_err("/dev/full took the file");
        assert!(error.to_string().contains("No space left"), "{error}");
    }

    /// A full disk met while a row group is written is said as what it is: the writer
    /// itself calls it "Invalid thrift: transport error", and the table's error read as a
    /// damaged file.
    #[test]
    fn a_disk_that_fills_up_mid_table_is_said_full() {
        /// A disk that fills up part of the way through: the writer's page header is cut.
        struct FillsUp(usize);
        impl io::Write for FillsUp {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                match self.0 {
                    0 => Err(io::Error::from_raw_os_error(28)),
                    room => {
                        let n = buf.len().min(room);
                        self.0 -= n;
                        Ok(n)
                    }
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        // Many small columns, as a table's: page headers are small writes the buffer takes
        // until one of them fills it, and the disk fills up under the writer's thrift.
        let schema = ArrowSchema::from_iter(
            (0..200).map(|i| Field::new(format!("c{i}").into(), ArrowDataType::Utf8View, true)),
        );
        let texts = ["a", "bb", "ccc", "dddd"].map(Some);
        let arrays: Vec<Box<dyn Array>> = (0..200)
            .map(|_| -> Box<dyn Array> {
                Box::new(MutableBinaryViewArray::<str>::from_iter(texts).freeze())
            })
            .collect();
        let mut thrift = 0;
        for room in (0..60_000).step_by(401) {
            let first = Arc::new(OnceLock::new());
            let file = KeptIoError {
                file: BufWriter::new(FillsUp(room)),
                first: first.clone(),
            };
            let Ok(mut writer) = FileWriter::try_new(file, schema.clone(), write_options()) else {
                continue;
            };
            let source = match crate::row_groups::write(&mut writer, 4, &arrays, write_options()) {
                Err(e) => e,
                Ok(()) => match writer.end(None) {
                    Err(e) => e,
                    Ok(_) => continue,
                },
            };
            thrift += usize::from(source.to_string().contains("thrift"));
            let error = write_error(&first, Path::new("t.parquet"), source);
            let cause = std::error::Error::source(&error).map(ToString::to_string);
            let said = format!("{error}: {}", cause.unwrap_or_default());
            assert!(said.contains("No space left"), "{room}: {said}");
        }
        assert!(thrift > 0, "the writer never said a full disk as thrift's");
    }

    fn strings(array: &dyn Array) -> Vec<Option<String>> {
        array
            .as_any()
            .downcast_ref::<Utf8ViewArray>()
            .expect("a text column")
            .iter()
            .map(|s| s.map(str::to_owned))
            .collect()
    }

    #[test]
    fn names_give_each_row_its_own_name_from_batch_to_batch() {
        let mut names = Names::default();
        for name in ["a", "a", "b", "a", "", "c"] {
            names.push(name);
        }
        let first = names.take_array().unwrap();
        assert_eq!(
            strings(first.as_ref()),
            ["a", "a", "b", "a", "", "c"].map(|s| Some(s.to_owned()))
        );
        // The next batch starts empty, with the names it meets again and new ones.
        for name in ["c", "d", "a"] {
            names.push(name);
        }
        assert_eq!(
            strings(names.take_array().unwrap().as_ref()),
            ["c", "d", "a"].map(|s| Some(s.to_owned()))
        );
        assert_eq!(names.take_array().unwrap().len(), 0);
        assert_eq!(names.names.len(), 5, "each name is kept once");
    }
}
