//! Parquet rows for the suite language's `dataset` nodes: the reader the binary registers
//! with `trellis_dsl::dataset::register_reader`, so the language crate needs no Arrow stack
//! of its own (polars' Arrow and Parquet crates are already here for the result tables).
//!
//! The file is read in slices of rows (small first, so a `limit` of a few rows decodes a
//! few rows; then larger), and each slice is turned into JSON column by column: one typed
//! pass over each column's values, never a per-cell dynamic lookup. Only one row group's
//! compressed column chunks and one slice's columns are held at a time besides the rows the
//! dataset keeps, and reading stops as soon as the dataset has what it needs.
//!
//! It reads at the Arrow level (polars' Parquet decoder, polars-arrow's arrays), as the rest
//! of Trellis does, not through polars' frames: a frame of 8- and 16-bit integers, decimals,
//! dates or structs needs polars-core built with those types.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::path::Path;

use polars_arrow::array::{
    Array, BinaryArray, BinaryViewArray, BooleanArray, FixedSizeBinaryArray, ListArray, MapArray,
    PrimitiveArray, StructArray, Utf8Array, Utf8ViewArray,
};
use polars_arrow::datatypes::{ArrowDataType, Field, TimeUnit};
use polars_arrow::offset::Offset;
use polars_buffer::Buffer;
use polars_error::PolarsError;
use polars_parquet::parquet::page::CompressedPage;
use polars_parquet::parquet::schema::Repetition;
use polars_parquet::parquet::schema::types::{GroupConvertedType, GroupLogicalType, ParquetType};
use polars_parquet::read::{
    BasicDecompressor, ColumnChunkMetadata, Filter, PageReader, column_iter_to_arrays,
    infer_schema, read_metadata,
};
use serde_json::{Map, Number, Value};
use trellis_dsl::dataset::{ReadError, RowReader, RowVisit};

use crate::contained::decode;

/// Reads a Parquet file's rows as JSON objects: numbers, booleans and strings keep their
/// types, lists become arrays, structs objects, maps objects (or a list of `{key, value}`
/// objects when a key is not text), dates, times and durations text (docs/language.md),
/// nulls `null`.
pub struct ParquetRows;

/// The first slice's rows: enough for a `limit` of a few rows without decoding more.
const FIRST_SLICE: usize = 1024;
/// The largest slice: bounds the columns held while their rows are handed out.
const MAX_SLICE: usize = 16 * 1024;

impl RowReader for ParquetRows {
    fn declared_columns(&self, path: &Path) -> Result<Option<Vec<String>>, ReadError> {
        let mut file = File::open(path)?;
        let metadata = damaged(decode(|| read_metadata(&mut file)))?.map_err(not_parquet)?;
        Ok(Some(
            metadata
                .schema()
                .fields()
                .iter()
                .map(|t| t.name().to_string())
                .collect(),
        ))
    }

    fn read(&self, path: &Path, visit: &mut RowVisit<'_>) -> Result<(), ReadError> {
        let mut file = File::open(path)?;
        let file_len = file.metadata()?.len();
        let mut metadata = damaged(decode(|| read_metadata(&mut file)))?.map_err(not_parquet)?;
        let mut schema = damaged(decode(|| infer_schema(&metadata)))?.map_err(not_parquet)?;
        // A dictionary column (pandas' `category`, what pyarrow writes for it) is only
        // dictionary in the Arrow schema the writer stored beside the Parquet one; read
        // without it, its values are the plain strings (or numbers) the pages hold.
        if schema.iter_values().any(|f| has_dictionary(&f.dtype)) {
            if let Some(pairs) = &mut metadata.key_value_metadata {
                pairs.retain(|kv| kv.key != "ARROW:schema");
            }
            schema = damaged(decode(|| infer_schema(&metadata)))?.map_err(not_parquet)?;
        }
        // The file's own Parquet types, which still tell maps from lists (without the
        // writer's Arrow schema a map reads as a list of key/value structs).
        let shapes: Vec<(String, Shape)> = metadata
            .schema()
            .fields()
            .iter()
            .map(|t| (t.name().to_string(), Shape::of(t)))
            .collect();
        for (name, field) in schema.iter() {
            if let Some(why) = unsupported(&field.dtype) {
                return Err(ReadError::Format(format!(
                    "column `{name}` is {why}, which Trellis does not read; write it as \
                     numbers or text"
                )));
            }
        }
        let fields: Vec<(&Field, &Shape)> = schema
            .iter_values()
            .map(|field| {
                let shape = shapes
                    .iter()
                    .find(|(n, _)| n == field.name.as_str())
                    .map_or(&Shape::Plain, |(_, s)| s);
                (field, shape)
            })
            .collect();
        // Rows of the row groups before this one.
        let mut before = 0usize;
        let mut slice = FIRST_SLICE;
        for group in &metadata.row_groups {
            let rows = group.num_rows();
            // The group's column chunks, read once (compressed) for all of its slices.
            let mut chunks = Vec::with_capacity(fields.len());
            for (field, _) in &fields {
                let columns = group
                    .columns_under_root_iter(&field.name)
                    .ok_or_else(|| {
                        ReadError::Format(format!(
                            "column `{}` is missing from a row group",
                            field.name
                        ))
                    })?
                    .map(|meta| {
                        let bytes = read_chunk(&mut file, file_len, meta)?;
                        check_pages(meta, &bytes, rows)?;
                        Ok((meta, bytes))
                    })
                    .collect::<Result<Vec<_>, ReadError>>()?;
                chunks.push(columns);
            }
            let mut start = 0;
            while start < rows {
                let end = rows.min(start + slice);
                let first = before + start + 1;
                let mut columns = Vec::with_capacity(fields.len());
                for ((field, shape), chunk) in fields.iter().zip(&chunks) {
                    let (pages, types): (Vec<_>, Vec<_>) = chunk
                        .iter()
                        .map(|(meta, bytes)| {
                            let pages = PageReader::new(
                                Cursor::new(bytes.clone()),
                                meta,
                                Vec::new(),
                                usize::MAX,
                            );
                            (
                                BasicDecompressor::new(pages, Vec::new()),
                                &meta.descriptor().descriptor.primitive_type,
                            )
                        })
                        .unzip();
                    let (arrays, _) = decode(|| {
                        column_iter_to_arrays(
                            pages,
                            types,
                            (*field).clone(),
                            Some(Filter::new_ranged(start, end)),
                        )
                    })
                    .map_err(|e| PolarsError::ComputeError(e.into()))
                    .and_then(|decoded| decoded)
                    .map_err(|e| {
                        ReadError::Format(format!("rows {first}–{}: {e}", before + end))
                    })?;
                    let mut values = Vec::with_capacity(end - start);
                    for array in &arrays {
                        let converted = json_values(array.as_ref(), shape).map_err(|message| {
                            ReadError::Row {
                                row: first,
                                column: Some(field.name.to_string()),
                                message,
                            }
                        })?;
                        values.extend(converted);
                    }
                    columns.push(values.into_iter());
                }
                for row in first..=before + end {
                    let mut values_of_row = Map::new();
                    for ((field, _), values) in fields.iter().zip(columns.iter_mut()) {
                        values_of_row
                            .insert(field.name.to_string(), values.next().unwrap_or(Value::Null));
                    }
                    if visit(row, Ok(values_of_row)).is_break() {
                        return Ok(());
                    }
                }
                start = end;
                slice = (slice * 4).min(MAX_SLICE);
            }
            before += rows;
        }
        Ok(())
    }
}

/// One column chunk's bytes, where its metadata places them in the file (checked against
/// the file's length first: a damaged footer must not ask for a huge allocation).
pub(crate) fn read_chunk(
    file: &mut File,
    file_len: u64,
    meta: &ColumnChunkMetadata,
) -> Result<Buffer<u8>, ReadError> {
    let range = meta.byte_range();
    if range.start > range.end || range.end > file_len {
        return Err(ReadError::Format(format!(
            "not a readable Parquet file: a column chunk at bytes {}–{} is outside the file \
             ({file_len} bytes)",
            range.start, range.end
        )));
    }
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| ReadError::Format("a column chunk too large to read".into()))?;
    let mut bytes = vec![0; len];
    file.seek(SeekFrom::Start(range.start))?;
    file.read_exact(&mut bytes)?;
    Ok(Buffer::from(bytes))
}

/// Checks a column chunk's page headers against its metadata before the decoder reads
/// them: the decoder sizes its buffers by a page's count of values, so a damaged count
/// (negative, read as 2^64 - n) would abort the process on an allocation it cannot make.
pub(crate) fn check_pages(
    meta: &ColumnChunkMetadata,
    bytes: &Buffer<u8>,
    rows: usize,
) -> Result<(), ReadError> {
    let damaged = |what: String| {
        ReadError::Format(format!(
            "not a readable Parquet file: column `{}` {what}",
            meta.descriptor().path_in_schema.join(".")
        ))
    };
    let declared = usize::try_from(meta.num_values())
        .map_err(|_| damaged(format!("declares {} values", meta.num_values())))?;
    // A column outside any list has a value (or a null) per row; one inside a list may
    // have more, or fewer, than its rows.
    if meta.descriptor().descriptor.max_rep_level == 0 && declared != rows {
        return Err(damaged(format!(
            "declares {declared} values for {rows} rows"
        )));
    }
    let pages = PageReader::new(Cursor::new(bytes.clone()), meta, Vec::new(), usize::MAX);
    let mut seen = 0usize;
    for page in pages {
        let page = page.map_err(|e| damaged(format!("has a damaged page: {e}")))?;
        if let CompressedPage::Data(page) = page {
            seen = seen
                .checked_add(page.num_values())
                .filter(|&n| n <= declared)
                .ok_or_else(|| {
                    damaged(format!(
                        "has pages of more values than the {declared} it declares"
                    ))
                })?;
        }
    }
    Ok(())
}

/// A panic of the decoder (see [`decode`]) as the file's error.
fn damaged<T>(decoded: Result<T, String>) -> Result<T, ReadError> {
    decoded.map_err(|why| ReadError::Format(format!("not a readable Parquet file: {why}")))
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

/// Why a column of this Arrow type cannot be read (polars' decoder, built without them,
/// panics on some).
fn unsupported(dtype: &ArrowDataType) -> Option<String> {
    use ArrowDataType as A;
    match dtype {
        A::Decimal256(..) => Some("a 256-bit decimal column".into()),
        A::Dictionary(..) => Some("a dictionary (categorical) column".into()),
        A::FixedSizeList(..) => Some("a fixed-size list column".into()),
        A::Int128 | A::UInt128 => Some("a 128-bit integer column".into()),
        // Types the polars build leaves out (each costs build time in every crate of it).
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

/// Where a column's maps are, from its Parquet type: without the writer's Arrow schema a
/// map reads as a list of `{key, value}` structs, with nothing left in its own types to
/// tell it from a list.
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

/// One array's values as JSON, in row order; `shape` says which of its lists are maps.
fn json_values(array: &dyn Array, shape: &Shape) -> Result<Vec<Value>, String> {
    use ArrowDataType as A;
    let len = array.len();
    // Each arm is one typed pass over the array's values; a null is `null` whatever the
    // type.
    macro_rules! each {
        ($array:ty, |$a:ident, $i:ident| $value:expr) => {{
            let $a = downcast::<$array>(array)?;
            (0..len)
                .map(|$i| if $a.is_null($i) { Value::Null } else { $value })
                .collect()
        }};
    }
    Ok(match array.dtype().to_storage() {
        A::Null => vec![Value::Null; len],
        A::Boolean => each!(BooleanArray, |a, i| Value::Bool(a.value(i))),
        A::Int8 => each!(PrimitiveArray<i8>, |a, i| Value::from(a.value(i))),
        A::Int16 => each!(PrimitiveArray<i16>, |a, i| Value::from(a.value(i))),
        A::Int32 => each!(PrimitiveArray<i32>, |a, i| Value::from(a.value(i))),
        A::Int64 => each!(PrimitiveArray<i64>, |a, i| Value::from(a.value(i))),
        A::UInt8 => each!(PrimitiveArray<u8>, |a, i| Value::from(a.value(i))),
        A::UInt16 => each!(PrimitiveArray<u16>, |a, i| Value::from(a.value(i))),
        A::UInt32 => each!(PrimitiveArray<u32>, |a, i| Value::from(a.value(i))),
        A::UInt64 => each!(PrimitiveArray<u64>, |a, i| Value::from(a.value(i))),
        A::Float32 => each!(PrimitiveArray<f32>, |a, i| float(f64::from(a.value(i)))),
        A::Float64 => each!(PrimitiveArray<f64>, |a, i| float(a.value(i))),
        // A decimal (a price, most often) is the number it is; JSON numbers are doubles,
        // so its digits beyond about 15 are rounded, as any JSON reader would.
        A::Decimal(_, scale) => {
            let divisor = decimal_divisor(*scale);
            each!(PrimitiveArray<i128>, |a, i| float(
                a.value(i) as f64 / divisor
            ))
        }
        A::Decimal32(_, scale) => {
            let divisor = decimal_divisor(*scale);
            each!(PrimitiveArray<i32>, |a, i| float(
                f64::from(a.value(i)) / divisor
            ))
        }
        A::Decimal64(_, scale) => {
            let divisor = decimal_divisor(*scale);
            each!(PrimitiveArray<i64>, |a, i| float(
                a.value(i) as f64 / divisor
            ))
        }
        A::Utf8View => each!(Utf8ViewArray, |a, i| Value::String(a.value(i).to_owned())),
        A::Utf8 => each!(Utf8Array<i32>, |a, i| Value::String(a.value(i).to_owned())),
        A::LargeUtf8 => each!(Utf8Array<i64>, |a, i| Value::String(a.value(i).to_owned())),
        // Bytes: their text, with the replacement character where they are not UTF-8.
        A::BinaryView => each!(BinaryViewArray, |a, i| bytes_text(a.value(i))),
        A::Binary => each!(BinaryArray<i32>, |a, i| bytes_text(a.value(i))),
        A::LargeBinary => each!(BinaryArray<i64>, |a, i| bytes_text(a.value(i))),
        A::FixedSizeBinary(_) => each!(FixedSizeBinaryArray, |a, i| bytes_text(a.value(i))),
        A::Date32 => each!(PrimitiveArray<i32>, |a, i| Value::String(iso::date(
            i64::from(a.value(i))
        ))),
        A::Date64 => each!(PrimitiveArray<i64>, |a, i| Value::String(iso::datetime(
            a.value(i),
            TimeUnit::Millisecond,
            false
        ))),
        A::Timestamp(unit, zone) => {
            let (unit, zoned) = (*unit, zone.is_some());
            each!(PrimitiveArray<i64>, |a, i| Value::String(iso::datetime(
                a.value(i),
                unit,
                zoned
            )))
        }
        A::Time32(unit) => {
            let unit = *unit;
            each!(PrimitiveArray<i32>, |a, i| Value::String(iso::time(
                i64::from(a.value(i)),
                unit
            )))
        }
        A::Time64(unit) => {
            let unit = *unit;
            each!(PrimitiveArray<i64>, |a, i| Value::String(iso::time(
                a.value(i),
                unit
            )))
        }
        A::Duration(unit) => {
            let unit = *unit;
            each!(PrimitiveArray<i64>, |a, i| Value::String(iso::duration(
                a.value(i),
                unit
            )))
        }
        A::List(_) => list::<i32>(array, shape)?,
        A::LargeList(_) => list::<i64>(array, shape)?,
        A::Map(..) => {
            let a = downcast::<MapArray>(array)?;
            let entries = match shape {
                Shape::Map(inner) | Shape::List(inner) => inner.as_ref(),
                _ => &Shape::Plain,
            };
            let values = json_values(a.field().as_ref(), entries)?;
            nest(
                len,
                values,
                |i| a.offsets().start_end(i),
                |i| a.is_null(i),
                map_names(a.field().dtype()),
            )
        }
        A::Struct(_) => {
            let a = downcast::<StructArray>(array)?;
            let shapes: &[(String, Shape)] = match shape {
                Shape::Struct(f) => f,
                _ => &[],
            };
            let mut fields = Vec::with_capacity(a.fields().len());
            for (field, values) in a.fields().iter().zip(a.values()) {
                let shape = shapes
                    .iter()
                    .find(|(n, _)| n == field.name.as_str())
                    .map_or(&Shape::Plain, |(_, s)| s);
                fields.push((
                    field.name.to_string(),
                    json_values(values.as_ref(), shape)?.into_iter(),
                ));
            }
            (0..len)
                .map(|i| {
                    let mut object = Map::new();
                    for (name, values) in fields.iter_mut() {
                        object.insert(name.clone(), values.next().unwrap_or(Value::Null));
                    }
                    if a.is_null(i) {
                        Value::Null
                    } else {
                        Value::Object(object)
                    }
                })
                .collect()
        }
        other => {
            return Err(format!(
                "a column of type {other:?}, which Trellis does not read"
            ));
        }
    })
}

/// `array` as the concrete array its type says it is.
fn downcast<T: 'static>(array: &dyn Array) -> Result<&T, String> {
    array.as_any().downcast_ref::<T>().ok_or_else(|| {
        format!(
            "an array that is not the {:?} its type says (a damaged file?)",
            array.dtype()
        )
    })
}

/// What a decimal's stored integer is divided by.
fn decimal_divisor(scale: usize) -> f64 {
    10f64.powi(i32::try_from(scale).unwrap_or(i32::MAX))
}

/// JSON has no NaN or infinity: those are `null`.
fn float(v: f64) -> Value {
    Number::from_f64(v).map_or(Value::Null, Value::Number)
}

/// Bytes as their text when they are UTF-8, else as base64: a replacement character for
/// each byte that is not could not be turned back into the bytes (`b"\x00\xff"` read
/// `"\u0000\u{fffd}"`).
fn bytes_text(bytes: &[u8]) -> Value {
    use base64::Engine as _;
    Value::String(match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

/// A list array's values as JSON arrays (or objects, when `shape` says the lists are maps).
fn list<O: Offset>(array: &dyn Array, shape: &Shape) -> Result<Vec<Value>, String> {
    let a = downcast::<ListArray<O>>(array)?;
    let (inner, is_map) = match shape {
        Shape::List(inner) => (inner.as_ref(), false),
        Shape::Map(inner) => (inner.as_ref(), true),
        _ => (&Shape::Plain, false),
    };
    let names = if is_map {
        map_names(a.values().dtype())
    } else {
        None
    };
    let values = json_values(a.values().as_ref(), inner)?;
    Ok(nest(
        a.len(),
        values,
        |i| a.offsets().start_end(i),
        |i| a.is_null(i),
        names,
    ))
}

/// The key's and the value's field names of a map's entries (`key`/`value`,
/// `keys`/`values`, as the writer chose).
fn map_names(entries: &ArrowDataType) -> Option<(String, String)> {
    match entries.to_storage() {
        ArrowDataType::Struct(f) if f.len() == 2 => {
            Some((f[0].name.to_string(), f[1].name.to_string()))
        }
        _ => None,
    }
}

/// `len` lists cut from `values` at `bounds(i)` (ascending, as offsets are): each an array,
/// or an object when `map` names its entries' key and value.
fn nest(
    len: usize,
    values: Vec<Value>,
    bounds: impl Fn(usize) -> (usize, usize),
    is_null: impl Fn(usize) -> bool,
    map: Option<(String, String)>,
) -> Vec<Value> {
    let mut values = values.into_iter();
    let mut at = 0usize;
    let mut out = Vec::with_capacity(len);
    for i in 0..len {
        let (start, end) = bounds(i);
        // Values are consumed in order: skip any before this list's start (a sliced
        // array) and take its own.
        while at < start {
            values.next();
            at += 1;
        }
        let items: Vec<Value> = values.by_ref().take(end.saturating_sub(at)).collect();
        at = at.max(end);
        if is_null(i) {
            out.push(Value::Null);
        } else if let Some((key, value)) = &map {
            out.push(map_entries(items, key, value));
        } else {
            out.push(Value::Array(items));
        }
    }
    out
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

/// Text of Arrow's dates, times and durations (ISO 8601; the proleptic Gregorian calendar),
/// without a time-zone database: a timestamp is the UTC instant it stores.
mod iso {
    use polars_arrow::datatypes::TimeUnit;

    /// Units of `unit` per second, and the digits of a fraction in it.
    fn scale(unit: TimeUnit) -> (i64, usize) {
        match unit {
            TimeUnit::Second => (1, 0),
            TimeUnit::Millisecond => (1_000, 3),
            TimeUnit::Microsecond => (1_000_000, 6),
            TimeUnit::Nanosecond => (1_000_000_000, 9),
        }
    }

    /// `2024-01-02` for days since 1970-01-01 (Howard Hinnant's `civil_from_days`).
    pub fn date(days: i64) -> String {
        let z = days.saturating_add(719_468);
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        format!("{year:04}-{month:02}-{day:02}")
    }

    /// `2024-01-02 03:04:05.000`: the fraction's digits are the unit's (none for
    /// seconds), as polars writes a datetime as text; `+00:00` after it when the column
    /// has a time zone (the value is the UTC instant).
    pub fn datetime(value: i64, unit: TimeUnit, zoned: bool) -> String {
        let (per_second, digits) = scale(unit);
        let per_day = per_second * 86_400;
        let days = value.div_euclid(per_day);
        let rest = value.rem_euclid(per_day);
        let (seconds, fraction) = (rest / per_second, rest % per_second);
        let (h, m, s) = (seconds / 3_600, seconds / 60 % 60, seconds % 60);
        let mut text = format!("{} {h:02}:{m:02}:{s:02}", date(days));
        if digits > 0 {
            text.push_str(&format!(".{fraction:0digits$}"));
        }
        if zoned {
            text.push_str("+00:00");
        }
        text
    }

    /// `03:04:05`, with the fraction of a second when there is one.
    pub fn time(value: i64, unit: TimeUnit) -> String {
        let (per_second, digits) = scale(unit);
        let seconds = value.div_euclid(per_second);
        let fraction = value.rem_euclid(per_second);
        let (h, m, s) = (seconds / 3_600, seconds / 60 % 60, seconds % 60);
        let mut text = format!("{h:02}:{m:02}:{s:02}");
        push_fraction(&mut text, fraction.unsigned_abs(), digits);
        text
    }

    /// `P1DT2H3M4.5S`; `PT0S` for none, and a negative duration signed (`-PT1S`).
    pub fn duration(value: i64, unit: TimeUnit) -> String {
        let (per_second, digits) = scale(unit);
        let per_second = per_second.unsigned_abs();
        let sign = if value < 0 { "-" } else { "" };
        let value = value.unsigned_abs();
        let (seconds, fraction) = (value / per_second, value % per_second);
        let (d, h, m, s) = (
            seconds / 86_400,
            seconds / 3_600 % 24,
            seconds / 60 % 60,
            seconds % 60,
        );
        let mut text = format!("{sign}P");
        if d > 0 {
            text.push_str(&format!("{d}D"));
        }
        let mut time = String::new();
        if h > 0 {
            time.push_str(&format!("{h}H"));
        }
        if m > 0 {
            time.push_str(&format!("{m}M"));
        }
        if s > 0 || fraction > 0 || (d, h, m) == (0, 0, 0) {
            time.push_str(&s.to_string());
            push_fraction(&mut time, fraction, digits);
            time.push('S');
        }
        if !time.is_empty() {
            text.push('T');
            text.push_str(&time);
        }
        text
    }

    /// `.5`, `.123`: the fraction's significant digits; nothing for none.
    fn push_fraction(text: &mut String, fraction: u64, digits: usize) {
        if fraction > 0 {
            let digits = format!("{fraction:0digits$}");
            text.push('.');
            text.push_str(digits.trim_end_matches('0'));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn dates_times_and_durations_read_as_iso_text() {
            assert_eq!(date(0), "1970-01-01");
            assert_eq!(date(19_724), "2024-01-02");
            assert_eq!(date(20_453), "2025-12-31");
            assert_eq!(date(-1), "1969-12-31");
            assert_eq!(date(11_016), "2000-02-29");
            assert_eq!(
                datetime(1_704_164_645_500, TimeUnit::Millisecond, false),
                "2024-01-02 03:04:05.500"
            );
            assert_eq!(
                datetime(1_704_164_645_000_001, TimeUnit::Microsecond, true),
                "2024-01-02 03:04:05.000001+00:00"
            );
            assert_eq!(datetime(-1, TimeUnit::Second, false), "1969-12-31 23:59:59");
            assert_eq!(
                time(45_296_000_001, TimeUnit::Microsecond),
                "12:34:56.000001"
            );
            assert_eq!(duration(93_784_500, TimeUnit::Millisecond), "P1DT2H3M4.5S");
            assert_eq!(duration(0, TimeUnit::Second), "PT0S");
            assert_eq!(duration(86_400, TimeUnit::Second), "P1D");
            assert_eq!(duration(-1, TimeUnit::Second), "-PT1S");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use polars_core::prelude::*;
    use std::ops::ControlFlow;

    /// UTF-8 bytes read as their text; any other bytes as base64, which turns back into
    /// them (a replacement character did not).
    #[test]
    fn bytes_are_text_when_utf8_and_base64_otherwise() {
        assert_eq!(bytes_text(b"caf\xc3\xa9"), Value::String("café".into()));
        assert_eq!(bytes_text(b"\x00\xff"), Value::String("AP8=".into()));
    }
    use polars_io::prelude::*;

    /// A small dataset as pandas or polars would write it: typed columns, statistics, a
    /// list column.
    pub(crate) fn parquet_bytes() -> Vec<u8> {
        let mut df = df!(
            "id" => [1i64, 2, 3],
            "name" => ["Ada", "Grace", "Barbara"],
            "score" => [0.5f64, 1.5, 2.5],
            "open" => [true, false, true],
        )
        .unwrap();
        let mut bytes = Vec::new();
        ParquetWriter::new(&mut bytes)
            .with_statistics(StatisticsOptions::full())
            .finish(&mut df)
            .unwrap();
        bytes
    }

    /// The bytes of `good` at which a damaged copy (the byte flipped, zeroed or
    /// incremented), written to `path`, makes `read` panic. The decoder panics on some (the
    /// footer's thrift, its statistics, the pages' headers); each must read as an error or
    /// as rows.
    pub(crate) fn panicking_damage(
        good: &[u8],
        path: &Path,
        read: impl Fn(&Path) + std::panic::RefUnwindSafe,
    ) -> Vec<usize> {
        let mut panicked = Vec::new();
        for at in 0..good.len() {
            for damage in [|b: u8| !b, |_| 0, |b: u8| b.wrapping_add(1)] {
                let mut bad = good.to_vec();
                bad[at] = damage(bad[at]);
                std::fs::write(path, &bad).unwrap();
                if std::panic::catch_unwind(|| read(path)).is_err() {
                    panicked.push(at);
                }
            }
        }
        panicked
    }

    #[test]
    fn a_damaged_file_is_an_error_whatever_byte_is_wrong() {
        let good = parquet_bytes();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        std::fs::write(&path, &good).unwrap();
        let mut rows = 0;
        ParquetRows
            .read(&path, &mut |_, _| {
                rows += 1;
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(rows, 3);
        // Both ways a dataset is read, every answer dropped.
        let panicked = panicking_damage(&good, &path, |path| {
            let _ = ParquetRows.declared_columns(path);
            let _ = ParquetRows.read(path, &mut |_, _| ControlFlow::Continue(()));
        });
        assert!(
            panicked.is_empty(),
            "panicked at bytes {panicked:?} of {}",
            good.len()
        );
    }
}
