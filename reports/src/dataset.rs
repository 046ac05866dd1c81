//! Parquet rows for the suite language's `dataset` nodes: the reader the binary registers
//! with `trellis_dsl::dataset::register_reader`, so the language crate needs no Arrow stack
//! of its own (polars is already here for the result tables).
//!
//! The file is read in slices of rows (small first, so a `limit` of a few rows decodes a
//! few rows; then larger), and each slice is turned into JSON column by column: one typed
//! pass over each column's values, never a per-cell dynamic lookup. Only one slice's
//! columns are held at a time besides the rows the dataset keeps, and reading stops as soon
//! as the dataset has what it needs.

use std::fs::File;
use std::ops::ControlFlow;
use std::path::Path;

use polars_core::prelude::*;
use polars_io::prelude::*;
use polars_parquet::parquet::schema::Repetition;
use polars_parquet::parquet::schema::types::{GroupConvertedType, GroupLogicalType, ParquetType};
use serde_json::{Map, Number, Value};
use trellis_dsl::dataset::{Fields, ReadError, RowReader};

/// Reads a Parquet file's rows as JSON objects: numbers, booleans and strings keep their
/// types, lists become arrays, structs objects, maps objects (or a list of `{key, value}`
/// objects when a key is not text), dates and times their ISO text, nulls `null`.
pub struct ParquetRows;

/// The first slice's rows: enough for a `limit` of a few rows without decoding more.
const FIRST_SLICE: usize = 1024;
/// The largest slice: bounds the columns held while their rows are handed out.
const MAX_SLICE: usize = 16 * 1024;

impl RowReader for ParquetRows {
    fn read(
        &self,
        path: &Path,
        visit: &mut dyn FnMut(usize, Fields) -> ControlFlow<()>,
    ) -> Result<(), ReadError> {
        let mut file = File::open(path)?;
        let (schema, metadata) = {
            let mut reader = ParquetReader::new(&mut file);
            let schema = reader.schema().map_err(not_parquet)?;
            let metadata = reader.get_metadata().map_err(not_parquet)?.clone();
            (schema, metadata)
        };
        // A dictionary column (pandas' `category`, what pyarrow writes for it) is only
        // dictionary in the Arrow schema the writer stored beside the Parquet one; read
        // without it, its values are the plain strings (or numbers) the pages hold.
        let (schema, metadata) = if schema.iter_values().any(|f| has_dictionary(&f.dtype)) {
            let mut plain = (*metadata).clone();
            if let Some(pairs) = &mut plain.key_value_metadata {
                pairs.retain(|kv| kv.key != "ARROW:schema");
            }
            let plain = std::sync::Arc::new(plain);
            let mut reader = ParquetReader::new(&mut file);
            reader.set_metadata(plain.clone());
            (reader.schema().map_err(not_parquet)?, plain)
        } else {
            (schema, metadata)
        };
        // The file's own Parquet types, which still tell maps from lists (polars reads
        // a map as a list of key/value structs, and says so in `schema` too).
        let shapes: Vec<(String, Shape)> = metadata
            .schema()
            .fields()
            .iter()
            .map(|t| (t.name().to_string(), Shape::of(t)))
            .collect();
        // polars panics on some Arrow types it is built without: refuse them first.
        for (name, field) in schema.iter() {
            if let Some(why) = unsupported(&field.dtype) {
                return Err(ReadError::Format(format!(
                    "column `{name}` is {why}, which Trellis does not read; write it as \
                     numbers or text"
                )));
            }
        }
        let names: Vec<String> = schema.iter_names().map(|n| n.to_string()).collect();
        let total = metadata.num_rows;
        let mut offset = 0;
        let mut slice = FIRST_SLICE;
        while offset < total {
            let len = slice.min(total - offset);
            let mut reader = ParquetReader::new(&mut file);
            reader.set_metadata(metadata.clone());
            // One thread: slices are small, and a pool's buffers per thread cost more
            // memory than the decoding they would share.
            let df = reader
                .read_parallel(ParallelStrategy::None)
                .with_slice(Some((offset, len)))
                .finish()
                .map_err(|e| {
                    ReadError::Format(format!("rows {}–{}: {e}", offset + 1, offset + len))
                })?;
            let mut columns = Vec::with_capacity(names.len());
            for column in df.columns() {
                let name = column.name();
                let shape = shapes
                    .iter()
                    .find(|(n, _)| n == name.as_str())
                    .map_or(&Shape::Plain, |(_, s)| s);
                let values =
                    json_column(column.as_materialized_series(), shape).map_err(|message| {
                        ReadError::Row {
                            row: offset + 1,
                            column: Some(name.to_string()),
                            message,
                        }
                    })?;
                columns.push(values.into_iter());
            }
            for i in 0..df.height() {
                let mut fields = Map::new();
                for (name, values) in names.iter().zip(columns.iter_mut()) {
                    fields.insert(name.clone(), values.next().unwrap_or(Value::Null));
                }
                if visit(offset + i + 1, fields).is_break() {
                    return Ok(());
                }
            }
            offset += len;
            slice = (slice * 4).min(MAX_SLICE);
        }
        Ok(())
    }
}

fn not_parquet(e: PolarsError) -> ReadError {
    ReadError::Format(format!("not a readable Parquet file: {e}"))
}

/// Whether a column of this type is, or holds, an Arrow dictionary.
fn has_dictionary(dtype: &ArrowDataType) -> bool {
    use ArrowDataType as A;
    match dtype {
        A::Dictionary(..) => true,
        A::List(f) | A::LargeList(f) | A::FixedSizeList(f, _) | A::Map(f, _) => {
            has_dictionary(&f.dtype)
        }
        A::Struct(fields) => fields.iter().any(|f| has_dictionary(&f.dtype)),
        _ => false,
    }
}

/// Why a column of this Arrow type cannot be read (this build of polars panics on them).
fn unsupported(dtype: &ArrowDataType) -> Option<String> {
    use ArrowDataType as A;
    match dtype {
        A::Decimal256(..) => Some("a 256-bit decimal column".into()),
        A::Dictionary(..) => Some("a dictionary (categorical) column".into()),
        A::FixedSizeList(..) => Some("a fixed-size list column".into()),
        A::Int128 | A::UInt128 => Some("a 128-bit integer column".into()),
        // Types this build of polars leaves out (each costs build time in every crate of it).
        A::Float16 => Some("a 16-bit float column".into()),
        A::Interval(_) => Some("an interval column".into()),
        A::Union(_) => Some("a union column".into()),
        A::Extension(_) => Some("an extension-type column".into()),
        A::List(f) | A::LargeList(f) | A::Map(f, _) => unsupported(&f.dtype),
        A::Struct(fields) => fields.iter().find_map(|f| {
            unsupported(&f.dtype).map(|why| format!("{why} (field `{}` of a struct)", f.name))
        }),
        _ => None,
    }
}

/// Where a column's maps are, from its Parquet type: polars reads a map as a list of
/// `{key, value}` structs, with nothing left in its own types to tell it from a list.
enum Shape {
    Plain,
    List(Box<Shape>),
    /// The entries' struct.
    Map(Box<Shape>),
    Struct(Vec<(String, Shape)>),
}

impl Shape {
    fn of(t: &ParquetType) -> Shape {
        let repeated = t.get_field_info().repetition == Repetition::Repeated;
        let shape = match t {
            ParquetType::PrimitiveType(_) => Shape::Plain,
            ParquetType::GroupType {
                logical_type,
                converted_type,
                fields,
                ..
            } => {
                let map = matches!(logical_type, Some(GroupLogicalType::Map))
                    || matches!(
                        converted_type,
                        Some(GroupConvertedType::Map | GroupConvertedType::MapKeyValue)
                    );
                let list = matches!(logical_type, Some(GroupLogicalType::List))
                    || matches!(converted_type, Some(GroupConvertedType::List));
                match (map, list, fields.as_slice()) {
                    // MAP { repeated group key_value { key; value } }
                    (true, _, [entries]) => {
                        return Shape::Map(Box::new(Shape::fields(entries)));
                    }
                    // LIST { repeated group list { element } }, or a repeated element.
                    (_, true, [repeated]) => {
                        let element = match repeated {
                            ParquetType::GroupType { fields, .. } if fields.len() == 1 => {
                                Shape::of(&fields[0])
                            }
                            other => Shape::fields(other),
                        };
                        return Shape::List(Box::new(element));
                    }
                    _ => Shape::fields(t),
                }
            }
        };
        if repeated {
            Shape::List(Box::new(shape))
        } else {
            shape
        }
    }

    /// A group's fields as a struct (a primitive as itself).
    fn fields(t: &ParquetType) -> Shape {
        match t {
            ParquetType::GroupType { fields, .. } => Shape::Struct(
                fields
                    .iter()
                    .map(|f| (f.name().to_string(), Shape::of(f)))
                    .collect(),
            ),
            ParquetType::PrimitiveType(_) => Shape::Plain,
        }
    }
}

/// One column's values as JSON, in row order; `shape` says which of its lists are maps.
fn json_column(s: &Series, shape: &Shape) -> Result<Vec<Value>, String> {
    let e = |e: PolarsError| e.to_string();
    Ok(match s.dtype() {
        DataType::Null => vec![Value::Null; s.len()],
        DataType::Boolean => s
            .bool()
            .map_err(e)?
            .iter()
            .map(|v| v.map_or(Value::Null, Value::Bool))
            .collect(),
        DataType::UInt64 => s
            .u64()
            .map_err(e)?
            .iter()
            .map(|v| v.map_or(Value::Null, Value::from))
            .collect(),
        dt if dt.is_integer() => s
            .cast(&DataType::Int64)
            .map_err(e)?
            .i64()
            .map_err(e)?
            .iter()
            .map(|v| v.map_or(Value::Null, Value::from))
            .collect(),
        // A decimal (a price, most often) is the number it is; JSON numbers are doubles,
        // so its digits beyond about 15 are rounded, as any JSON reader would.
        DataType::Float32 | DataType::Float64 | DataType::Decimal(..) => s
            .cast(&DataType::Float64)
            .map_err(e)?
            .f64()
            .map_err(e)?
            .iter()
            // JSON has no NaN or infinity: those are `null`.
            .map(|v| {
                v.and_then(Number::from_f64)
                    .map_or(Value::Null, Value::Number)
            })
            .collect(),
        DataType::String => strings(s)?,
        DataType::Date | DataType::Datetime(..) | DataType::Duration(_) | DataType::Time => {
            strings(&s.cast(&DataType::String).map_err(e)?)?
        }
        DataType::List(_) => {
            let (inner_shape, is_map) = match shape {
                Shape::List(inner) => (inner.as_ref(), false),
                Shape::Map(inner) => (inner.as_ref(), true),
                _ => (&Shape::Plain, false),
            };
            let list = s.list().map_err(e)?.rechunk();
            let inner = list.get_inner();
            // A map's entries are structs of two fields, the key's and the value's, named
            // as the writer chose (`key`/`value`, `keys`/`values`).
            let map_names = match inner.dtype() {
                DataType::Struct(f) if is_map && f.len() == 2 => {
                    Some((f[0].name().to_string(), f[1].name().to_string()))
                }
                _ => None,
            };
            let inner = json_column(&inner, inner_shape)?;
            let array = list.downcast_as_array();
            let offsets = array.offsets().as_slice();
            let validity = array.validity();
            let mut inner = inner.into_iter();
            let mut at = 0usize;
            let mut out = Vec::with_capacity(s.len());
            for i in 0..array.len() {
                let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
                // Values of the inner column are consumed in order: skip any before this
                // list's start (a sliced array) and take its own.
                while at < start {
                    inner.next();
                    at += 1;
                }
                let items: Vec<Value> = inner.by_ref().take(end - start).collect();
                at = end;
                if validity.is_some_and(|v| !v.get_bit(i)) {
                    out.push(Value::Null);
                } else if let Some((key, value)) = &map_names {
                    out.push(map_entries(items, key, value));
                } else {
                    out.push(Value::Array(items));
                }
            }
            out
        }
        DataType::Struct(_) => {
            let shapes: &[(String, Shape)] = match shape {
                Shape::Struct(f) => f,
                _ => &[],
            };
            let st = s.struct_().map_err(e)?.rechunk();
            let mut fields = Vec::new();
            for f in st.fields_as_series() {
                let shape = shapes
                    .iter()
                    .find(|(n, _)| n == f.name().as_str())
                    .map_or(&Shape::Plain, |(_, s)| s);
                fields.push((f.name().to_string(), json_column(&f, shape)?.into_iter()));
            }
            let validity = st.rechunk_validity();
            (0..s.len())
                .map(|i| {
                    let mut object = Map::new();
                    for (name, values) in fields.iter_mut() {
                        object.insert(name.clone(), values.next().unwrap_or(Value::Null));
                    }
                    if validity.as_ref().is_some_and(|v| !v.get_bit(i)) {
                        Value::Null
                    } else {
                        Value::Object(object)
                    }
                })
                .collect()
        }
        // Binary and anything rarer: their text as polars shows it.
        _ => s
            .iter()
            .map(|v| match v {
                AnyValue::Null => Value::Null,
                other => Value::String(other.to_string()),
            })
            .collect(),
    })
}

fn strings(s: &Series) -> Result<Vec<Value>, String> {
    Ok(s.str()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|v| v.map_or(Value::Null, |t| Value::String(t.to_string())))
        .collect())
}

/// A map's entries (`{key, value}` objects) as one object when every key is text or a
/// number (as JSON object keys are), else left as the list of entries.
fn map_entries(entries: Vec<Value>, key: &str, value: &str) -> Value {
    let textual = entries.iter().all(|entry| {
        matches!(
            entry.get(key),
            Some(Value::String(_)) | Some(Value::Number(_)) | Some(Value::Bool(_))
        )
    });
    if !textual {
        return Value::Array(entries);
    }
    let mut object = Map::new();
    for entry in entries {
        if let Value::Object(mut entry) = entry {
            let k = match entry.remove(key) {
                Some(Value::String(k)) => k,
                Some(other) => other.to_string(),
                None => continue,
            };
            object.insert(k, entry.remove(value).unwrap_or(Value::Null));
        }
    }
    Value::Object(object)
}
