//! Parquet rows for the suite language's `dataset` nodes: the reader the binary registers
//! with `trellis_dsl::dataset::register_reader`, so the language crate needs no Arrow stack
//! of its own (polars is already here for the result tables).

use std::fs::File;
use std::ops::ControlFlow;
use std::path::Path;

use polars::prelude::*;
use serde_json::{Map, Number, Value};
use trellis_dsl::dataset::{Fields, ReadError, RowReader};

/// Reads a Parquet file's rows as JSON objects: numbers, booleans and strings keep their
/// types, lists become arrays, dates and times their ISO text, nulls `null`.
pub struct ParquetRows;

impl RowReader for ParquetRows {
    fn read(
        &self,
        path: &Path,
        visit: &mut dyn FnMut(usize, Fields) -> ControlFlow<()>,
    ) -> Result<(), ReadError> {
        let file = File::open(path)?;
        let df = ParquetReader::new(file)
            .finish()
            .map_err(|e| ReadError::Format(format!("not a readable Parquet file: {e}")))?;
        // One chunk per column, so reading a cell is an index, not a search of chunks.
        let columns: Vec<(String, Series)> = df
            .columns()
            .iter()
            .map(|c| (c.name().to_string(), c.as_materialized_series().rechunk()))
            .collect();
        for i in 0..df.height() {
            let mut fields = Map::new();
            for (name, series) in &columns {
                let value = series.get(i).map_err(|e| ReadError::Row {
                    row: i + 1,
                    column: Some(name.clone()),
                    message: e.to_string(),
                })?;
                fields.insert(name.clone(), json(&value));
            }
            if visit(i + 1, fields).is_break() {
                break;
            }
        }
        Ok(())
    }
}

fn json(v: &AnyValue) -> Value {
    match v {
        AnyValue::Null => Value::Null,
        AnyValue::Boolean(b) => Value::Bool(*b),
        AnyValue::String(s) => Value::String((*s).to_string()),
        AnyValue::StringOwned(s) => Value::String(s.to_string()),
        AnyValue::UInt8(n) => Value::from(*n),
        AnyValue::UInt16(n) => Value::from(*n),
        AnyValue::UInt32(n) => Value::from(*n),
        AnyValue::UInt64(n) => Value::from(*n),
        AnyValue::Int8(n) => Value::from(*n),
        AnyValue::Int16(n) => Value::from(*n),
        AnyValue::Int32(n) => Value::from(*n),
        AnyValue::Int64(n) => Value::from(*n),
        AnyValue::Float32(f) => float(f64::from(*f)),
        AnyValue::Float64(f) => float(*f),
        AnyValue::List(s) => Value::Array(
            (0..s.len())
                .map(|i| s.get(i).map_or(Value::Null, |v| json(&v)))
                .collect(),
        ),
        // Dates, times, decimals, binary: their text as polars shows it.
        other => Value::String(other.to_string()),
    }
}

/// JSON has no NaN or infinity: those are `null`.
fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}
