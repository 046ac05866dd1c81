//! Node views and typed values: a KDL node split into arguments and properties, the spans
//! diagnostics point at, and the readers of strings, numbers, durations, sizes, regexes and
//! JSON values that report a value of the wrong type or out of range.

use super::*;

/// A node split into arguments and properties. For inline criteria (`expect tool "x"`) the
/// first argument plays the node's name.
#[derive(Clone)]
pub(super) struct View<'a> {
    pub(super) name: &'a str,
    pub(super) name_span: SourceSpan,
    /// The whole node, trailing whitespace trimmed.
    pub(super) span: SourceSpan,
    pub(super) args: Vec<&'a KdlEntry>,
    pub(super) props: Vec<&'a KdlEntry>,
    pub(super) children: Option<&'a KdlDocument>,
}

impl<'a> View<'a> {
    pub(super) fn of(node: &'a KdlNode, text: &str) -> Self {
        let (args, props) = node.entries().iter().partition(|e| e.name().is_none());
        View {
            name: node.name().value(),
            name_span: node.name().span(),
            span: trim_span(text, node.span()),
            args,
            props,
            children: node.children(),
        }
    }

    /// The view with its first argument as the name (`expect reply contains="x"`).
    pub(super) fn shifted(&self) -> Option<(View<'a>, &'a KdlEntry)> {
        let (first, rest) = self.args.split_first()?;
        let name = first.value().as_string()?;
        let start = first.span().offset();
        let end = self.span.offset() + self.span.len();
        Some((
            View {
                name,
                name_span: first.span(),
                span: SourceSpan::from(start..end.max(start)),
                args: rest.to_vec(),
                props: self.props.clone(),
                children: None,
            },
            first,
        ))
    }

    pub(super) fn prop(&self, key: &str) -> Option<&'a KdlEntry> {
        self.props
            .iter()
            .rev()
            .find(|e| e.name().is_some_and(|n| n.value() == key))
            .copied()
    }
}

/// The span of an entry's value, without `key=` (entry spans cover the whole property).
pub(super) fn value_span(e: &KdlEntry) -> SourceSpan {
    let span = e.span();
    match (e.name(), e.format()) {
        (Some(_), Some(f)) if !f.value_repr.is_empty() && f.value_repr.len() <= span.len() => {
            let end = span.offset() + span.len();
            SourceSpan::from(end - f.value_repr.len()..end)
        }
        _ => span,
    }
}

pub(super) fn prop_name(e: &KdlEntry) -> &str {
    e.name().map_or("", |n| n.value())
}

/// The span without trailing whitespace (kdl includes it in node spans).
pub(super) fn trim_span(text: &str, span: SourceSpan) -> SourceSpan {
    let start = span.offset();
    let end = start + span.len();
    match text.get(start..end) {
        Some(s) => SourceSpan::from(start..start + s.trim_end().len()),
        None => span,
    }
}

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn value_kind(v: &KdlValue) -> &'static str {
    match v {
        KdlValue::String(_) => "a string",
        KdlValue::Integer(_) => "an integer",
        KdlValue::Float(_) => "a float",
        KdlValue::Bool(_) => "a boolean",
        KdlValue::Null => "#null",
    }
}

/// Parses a size: an integer number of bytes or a string like `"8MiB"`, `"512KiB"`, `"1MB"`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num = num.replace('_', "");
    if num.is_empty() {
        return Err(format!("`{s}` does not start with a number"));
    }
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}`")),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(factor)
            .ok_or_else(|| format!("`{s}` is too large"));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{num}` is not a number"))?;
    let bytes = (n * factor as f64).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration like `"2s"`, `"500ms"`, `"2m"`, `"1h 30m"`. Errors are said in the
/// suite's terms: humantime's own list every unit it knows, months and years included, "and
/// few variations".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    use humantime::DurationError as E;
    humantime::parse_duration(s.trim())
        .map_err(|e| match e {
            E::Empty => "empty: a number and a unit are needed".to_owned(),
            E::UnknownUnit { unit, .. } if unit.is_empty() => {
                "a number needs a unit (`ms`, `s`, `m`, `h`)".to_owned()
            }
            E::UnknownUnit { unit, .. } => {
                // The long names humantime also reads, each with its short unit.
                const NAMES: [(&str, &str); 12] = [
                    ("milliseconds", "ms"),
                    ("millis", "ms"),
                    ("seconds", "s"),
                    ("secs", "s"),
                    ("minutes", "m"),
                    ("mins", "m"),
                    ("hours", "h"),
                    ("hrs", "h"),
                    ("days", "d"),
                    ("microseconds", "us"),
                    ("nanoseconds", "ns"),
                    ("weeks", "w"),
                ];
                // Units are written in lower case (`M` is months): `2S` meant `2s`.
                let lower = unit.to_ascii_lowercase();
                let short = NAMES
                    .iter()
                    .find(|(_, short)| *short == lower)
                    .map(|(_, short)| format!("did you mean `{short}`? "));
                let meant = short
                    .or_else(|| {
                        crate::diagnostics::did_you_mean(
                            &lower,
                            NAMES.iter().map(|(name, _)| *name),
                        )
                        .and_then(|name| NAMES.iter().find(|(n, _)| *n == name))
                        .map(|(name, short)| format!("did you mean `{name}` (`{short}`)? "))
                    })
                    .unwrap_or_default();
                format!(
                    "unknown unit `{unit}`: {meant}use `ms`, `s`, `m` or `h` (also `us`, `ns`, `d`)"
                )
            }
            E::NumberExpected(at) | E::InvalidCharacter(at) => format!(
                "not a duration from character {}: write a number, then its unit",
                // A byte offset; counted in characters where it falls between two.
                s.trim()
                    .get(..at)
                    .map_or(at, |before| before.chars().count())
                    + 1
            ),
            E::NumberOverflow => "too large".to_owned(),
        })
        .and_then(|d| {
            // humantime reads up to u64::MAX seconds; a clock cannot add that much to now (the
            // run panicked on a deadline of `200000000000000d`), and no wait is that long.
            if d > MOST_DURATION {
                Err("too large: at most 100 years".to_owned())
            } else {
                Ok(d)
            }
        })
}

/// The longest duration a suite or a flag may give: 100 years, far past any run, and far
/// inside what the system's clock can add to the present.
pub const MOST_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl<'f> Decoder<'f> {
    // ----- typed values

    pub(super) fn string(&mut self, e: &KdlEntry) -> Option<String> {
        match e.value() {
            KdlValue::String(s) => Some(s.clone()),
            _ => {
                self.wrong_type(e, "a string", "write it in double quotes: \"…\"");
                None
            }
        }
    }

    pub(super) fn spanned_string(&mut self, e: &KdlEntry) -> Option<Spanned<String>> {
        let s = self.string(e)?;
        Some(Spanned::new(s, self.span(value_span(e))))
    }

    pub(super) fn template(&mut self, e: &KdlEntry) -> Option<Template> {
        let s = self.string(e)?;
        Some(Template {
            source: s,
            span: self.span(value_span(e)),
        })
    }

    pub(super) fn integer(&mut self, e: &KdlEntry, min: i128, max: i128) -> Option<i128> {
        match e.value() {
            KdlValue::Integer(i) if *i < min || *i > max => {
                let unbounded = max == i128::from(u64::MAX) || max == i128::from(u32::MAX);
                let msg = if *i < min && unbounded {
                    format!("{i} is out of range: must be at least {min}")
                } else if unbounded {
                    format!("{i} is out of range: must be at most {max}")
                } else {
                    format!("{i} is out of range: must be between {min} and {max}")
                };
                let d = self
                    .diag(Kind::OutOfRange, msg, value_span(e), "out of range")
                    .with_help(if *i < min {
                        format!("use a whole number from {min}")
                    } else {
                        format!("use a whole number up to {max}")
                    });
                self.report(d);
                None
            }
            KdlValue::Integer(i) => Some(*i),
            _ => {
                self.wrong_type(
                    e,
                    "an integer",
                    "write a whole number without quotes, e.g. 3",
                );
                None
            }
        }
    }

    pub(super) fn u32(&mut self, e: &KdlEntry, min: u32) -> Option<u32> {
        self.integer(e, i128::from(min), i128::from(u32::MAX))
            .and_then(|i| u32::try_from(i).ok())
    }

    pub(super) fn u64(&mut self, e: &KdlEntry, min: u64) -> Option<u64> {
        self.integer(e, i128::from(min), i128::from(u64::MAX))
            .and_then(|i| u64::try_from(i).ok())
    }

    pub(super) fn number(&mut self, e: &KdlEntry, range: Option<(f64, f64)>) -> Option<f64> {
        let n = match e.value() {
            KdlValue::Integer(i) => *i as f64,
            KdlValue::Float(f) => *f,
            _ => {
                self.wrong_type(e, "a number", "write a number without quotes, e.g. 0.7");
                return None;
            }
        };
        if let Some((lo, hi)) = range
            && !(lo..=hi).contains(&n)
        {
            let d = self
                .diag(
                    Kind::OutOfRange,
                    format!("{n} is out of range: must be between {lo} and {hi}"),
                    value_span(e),
                    "out of range",
                )
                .with_help(format!("use a number from {lo} to {hi}"));
            self.report(d);
            return None;
        }
        Some(n)
    }

    pub(super) fn boolean(&mut self, e: &KdlEntry) -> Option<bool> {
        match e.value() {
            KdlValue::Bool(b) => Some(*b),
            _ => {
                self.wrong_type(e, "a boolean", "write #true or #false");
                None
            }
        }
    }

    pub(super) fn duration(&mut self, e: &KdlEntry) -> Option<Duration> {
        let s = match e.value() {
            KdlValue::String(s) => s,
            _ => {
                self.wrong_type(
                    e,
                    "a duration string",
                    "write a duration like \"500ms\", \"2s\" or \"2m\"",
                );
                return None;
            }
        };
        match parse_duration(s) {
            Ok(d) => Some(d),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidDuration,
                        format!("invalid duration `{s}`"),
                        value_span(e),
                        err,
                    )
                    .with_help("write a duration like \"500ms\", \"2s\", \"2m\" or \"1h 30m\"");
                self.report(d);
                None
            }
        }
    }

    /// A `timeout`: a duration longer than zero (`"0s"` would end every call, or the whole
    /// trajectory, before it started: every one an error at run time).
    pub(super) fn timeout(&mut self, e: &KdlEntry) -> Option<Duration> {
        let d = self.duration(e)?;
        if d.is_zero() {
            let diag = self
                .diag(
                    Kind::OutOfRange,
                    "a timeout of zero",
                    value_span(e),
                    "ends everything before it starts",
                )
                .with_help("give the time a call (or the trajectory) may take, e.g. \"30s\"");
            self.report(diag);
            return None;
        }
        Some(d)
    }

    pub(super) fn size(&mut self, e: &KdlEntry) -> Option<u64> {
        let s = match e.value() {
            KdlValue::Integer(_) => return self.u64(e, 1),
            KdlValue::String(s) => s,
            _ => {
                self.wrong_type(
                    e,
                    "a size",
                    "write a number of bytes or a string like \"8MiB\"",
                );
                return None;
            }
        };
        match parse_size(s) {
            Ok(n) => Some(n),
            Err(err) => {
                let d = self
                    .diag(
                        Kind::InvalidSize,
                        format!("invalid size `{s}`"),
                        value_span(e),
                        err,
                    )
                    .with_help("write a number of bytes or a string like \"512KiB\" or \"8MiB\"");
                self.report(d);
                None
            }
        }
    }

    /// One of `choices`, reported with did-you-mean otherwise.
    pub(super) fn choice<T: Copy>(
        &mut self,
        e: &KdlEntry,
        what: &str,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let s = self.string(e)?;
        if let Some((_, t)) = choices.iter().find(|(n, _)| *n == s) {
            return Some(*t);
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let list = names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let help = match did_you_mean(&s, names.iter().copied()) {
            Some(best) => format!("did you mean `{best}`?"),
            None => format!("use one of {list}"),
        };
        let d = self
            .diag(
                Kind::InvalidValue,
                format!("invalid {what} `{s}`"),
                value_span(e),
                format!("expected one of {list}"),
            )
            .with_help(help);
        self.report(d);
        None
    }

    pub(super) fn regex(&mut self, e: &KdlEntry) -> Option<crate::model::Pattern> {
        let s = self.string(e)?;
        match crate::model::Pattern::new(&s) {
            Ok(r) => Some(r),
            Err(err) => {
                let text = err.to_string();
                let short = text
                    .lines()
                    .rev()
                    .find_map(|l| l.strip_prefix("error: "))
                    .map(str::to_string)
                    .unwrap_or_else(|| text.lines().next().unwrap_or("").to_string());
                let span = self.regex_error_span(e, &s, &text).unwrap_or(value_span(e));
                let d = self
                    .diag(Kind::InvalidRegex, format!("invalid regex: {short}"), span, short)
                    .with_help(
                        "regexes use Rust `regex` syntax (https://docs.rs/regex); write them as KDL raw strings: #\"\\d+\"#",
                    );
                self.report(d);
                None
            }
        }
    }

    /// Where in the source the regex error points, read from the caret line of the error
    /// (only when the pattern is one line and written without escapes, so offsets match).
    pub(super) fn regex_error_span(
        &self,
        e: &KdlEntry,
        pattern: &str,
        error: &str,
    ) -> Option<SourceSpan> {
        if pattern.contains('\n') {
            return None;
        }
        let lines: Vec<&str> = error.lines().collect();
        let caret_line = lines.iter().position(|l| l.trim_start().starts_with('^'))?;
        let carets = lines.get(caret_line)?;
        let pattern_line = lines.get(caret_line.checked_sub(1)?)?;
        let indent = pattern_line.len() - pattern_line.trim_start().len();
        let col = carets.find('^')?.checked_sub(indent)?;
        let width = carets.trim().chars().filter(|c| *c == '^').count().max(1);
        let start = pattern.char_indices().nth(col).map(|(i, _)| i)?;
        let end = pattern
            .char_indices()
            .nth(col + width)
            .map_or(pattern.len(), |(i, _)| i);
        let vspan = value_span(e);
        let raw = self.source_of(vspan);
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let inner = raw
            .get(hashes..raw.len().checked_sub(hashes)?)?
            .strip_prefix('"')?
            .strip_suffix('"')?;
        if inner != pattern {
            return None;
        }
        let base = vspan.offset() + hashes + 1;
        Some(SourceSpan::from(base + start..base + end))
    }

    pub(super) fn json(&mut self, e: &KdlEntry) -> Option<Value> {
        match e.value() {
            KdlValue::String(s) => Some(Value::String(s.clone())),
            KdlValue::Bool(b) => Some(Value::Bool(*b)),
            KdlValue::Null => Some(Value::Null),
            KdlValue::Integer(i) => {
                if let Ok(n) = i64::try_from(*i) {
                    Some(Value::Number(Number::from(n)))
                } else if let Ok(n) = u64::try_from(*i) {
                    Some(Value::Number(Number::from(n)))
                } else {
                    let d = self
                        .diag(
                            Kind::OutOfRange,
                            format!("{i} does not fit in a JSON number"),
                            value_span(e),
                            "too large",
                        )
                        .with_help("write it as a string");
                    self.report(d);
                    None
                }
            }
            KdlValue::Float(f) => match Number::from_f64(*f) {
                Some(n) => Some(Value::Number(n)),
                None => {
                    let d = self
                        .diag(
                            Kind::OutOfRange,
                            "infinite and NaN numbers are not JSON".to_string(),
                            value_span(e),
                            "not a JSON number",
                        )
                        .with_help("write it as a string");
                    self.report(d);
                    None
                }
            },
        }
    }

    /// A required first argument (an id or name).
    pub(super) fn id_arg(&mut self, v: &View, what: &str, usage: &str) -> Option<Spanned<String>> {
        match v.args.first() {
            // An empty name names nothing: a capture no template can read, a tool no call
            // has, an agent no scenario can pick.
            Some(e) if e.value().as_string().is_some_and(|s| s.trim().is_empty()) => {
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!("`{}` needs {what}, not an empty one", v.name),
                        e.span(),
                        "empty",
                    )
                    .with_help(format!("write `{usage}`"));
                self.report(d);
                None
            }
            // A control character (ESC, BEL, CR, a newline) would be written as it is
            // wherever the name is shown: a terminal's title set, its line erased, a CI log
            // line cut in two.
            Some(e)
                if e.value()
                    .as_string()
                    .is_some_and(|s| s.chars().any(char::is_control)) =>
            {
                let shown = e
                    .value()
                    .as_string()
                    .and_then(|s| s.chars().find(|c| c.is_control()))
                    .map(|c| format!("U+{:04X}", u32::from(c)))
                    .unwrap_or_default();
                let d = self
                    .diag(
                        Kind::InvalidValue,
                        format!(
                            "`{}` needs {what} without control characters: this one holds {shown}",
                            v.name
                        ),
                        e.span(),
                        "a control character in it",
                    )
                    .with_help(
                        "names are shown on terminals, in CI logs and reports: write them \
                         without control characters (tabs, newlines and escapes included)",
                    );
                self.report(d);
                None
            }
            Some(e) => self.spanned_string(e),
            None => {
                self.missing(v, what, usage);
                None
            }
        }
    }

    /// [`Decoder::id_arg`] of a definition whose body is read either way: without an id (or
    /// with an empty one, said), a stand-in (empty, at the node's name) and `false`, so that
    /// the body's own problems are said now rather than once the id is fixed; the caller
    /// then drops the definition.
    pub(super) fn id_or_stand_in(
        &mut self,
        v: &View,
        what: &str,
        usage: &str,
    ) -> (Spanned<String>, bool) {
        match self.id_arg(v, what, usage) {
            Some(id) => (id, true),
            None => (Spanned::new(String::new(), self.span(v.name_span)), false),
        }
    }

    /// The one value of a setting or a one-argument node, checked against its `spec`.
    pub(super) fn single<'a>(
        &mut self,
        v: &View<'a>,
        spec: &NodeSpec,
        usage: &str,
    ) -> Option<&'a KdlEntry> {
        self.check(v, spec, usage);
        match v.args.first() {
            Some(e) => Some(*e),
            None => {
                self.missing(v, "a value", usage);
                None
            }
        }
    }
}

/// Why `url` cannot be an HTTP endpoint, as the HTTP client would find when the run starts
/// (`http://127.0.0.1:99999/…` passed `check` and failed every trajectory before).
pub fn url_problem(url: &str) -> Option<String> {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Some("it must start with http:// or https://".into());
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Some("it has no host".into());
    }
    if url.chars().any(char::is_whitespace) {
        return Some("it contains whitespace".into());
    }
    match url::Url::parse(url) {
        Ok(parsed) if parsed.port() == Some(0) => {
            Some("port 0 is no port an agent listens on (1–65535)".into())
        }
        Ok(_) => None,
        Err(url::ParseError::InvalidPort) => {
            Some("its port is not a number from 1 to 65535".into())
        }
        Err(url::ParseError::EmptyHost) => Some("it has no host".into()),
        Err(e) => Some(e.to_string()),
    }
}
