//! Tool calls read from an agent's spans: the GenAI semantic conventions' `execute_tool`
//! spans (`gen_ai.operation.name = execute_tool`, `gen_ai.tool.name`,
//! `gen_ai.tool.call.id`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`), and
//! OpenInference's `TOOL` spans (`openinference.span.kind`, `tool.name`,
//! `input.value`/`tool.parameters`, `output.value`), which many frameworks emit instead.
//!
//! Calls keep their timing: calls whose spans overlap in time ran in parallel and share a
//! `group`, so an order check never reads two concurrent calls as one after the other (the
//! trap of flattening spans into a list).

use crate::record::SpanRecord;

/// One tool call seen in a span.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanToolCall {
    pub name: String,
    pub call_id: Option<String>,
    /// JSON text, when the span recorded the arguments.
    pub arguments: Option<String>,
    pub result: Option<String>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// Calls of one group overlapped in time (ran in parallel); groups are numbered in
    /// start order.
    pub group: u32,
}

/// The tool calls in `spans`, in start order, grouped by overlap.
pub fn tool_calls(spans: &[SpanRecord]) -> Vec<SpanToolCall> {
    let mut calls: Vec<SpanToolCall> = spans.iter().filter_map(tool_call).collect();
    calls.sort_by_key(|c| (c.start_unix_nano, c.end_unix_nano));
    let mut group = 0u32;
    let mut group_end: Option<u64> = None;
    for call in &mut calls {
        match group_end {
            Some(end) if call.start_unix_nano < end => {
                group_end = Some(end.max(call.end_unix_nano));
            }
            Some(_) => {
                group += 1;
                group_end = Some(call.end_unix_nano);
            }
            None => group_end = Some(call.end_unix_nano),
        }
        call.group = group;
    }
    calls
}

fn tool_call(span: &SpanRecord) -> Option<SpanToolCall> {
    let genai = span.attribute("gen_ai.operation.name").as_deref() == Some("execute_tool");
    let openinference = span.attribute("openinference.span.kind").as_deref() == Some("TOOL");
    if !genai && !openinference {
        return None;
    }
    let name = span
        .attribute("gen_ai.tool.name")
        .or_else(|| span.attribute("tool.name"))
        // The GenAI span name is `execute_tool {gen_ai.tool.name}`.
        .or_else(|| span.name.strip_prefix("execute_tool ").map(str::to_owned))?;
    let first = |keys: &[&str]| keys.iter().find_map(|k| span.attribute(k));
    Some(SpanToolCall {
        name,
        call_id: first(&["gen_ai.tool.call.id", "tool_call.id"]),
        arguments: first(&[
            "gen_ai.tool.call.arguments",
            "tool.parameters",
            "input.value",
        ]),
        result: first(&["gen_ai.tool.call.result", "output.value"]),
        start_unix_nano: span.start_unix_nano,
        end_unix_nano: span.end_unix_nano,
        group: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, start: u64, end: u64) -> SpanRecord {
        let mut attributes = serde_json::Map::new();
        attributes.insert("gen_ai.operation.name".into(), "execute_tool".into());
        attributes.insert("gen_ai.tool.name".into(), name.into());
        SpanRecord {
            name: format!("execute_tool {name}"),
            start_unix_nano: start,
            end_unix_nano: end,
            attributes,
            ..SpanRecord::default()
        }
    }

    #[test]
    fn overlapping_calls_share_a_group() {
        let spans = [
            tool("c", 30, 40),
            tool("a", 0, 10),
            tool("b", 5, 12),
            SpanRecord::default(),
        ];
        let calls = tool_calls(&spans);
        let seen: Vec<(&str, u32)> = calls.iter().map(|c| (c.name.as_str(), c.group)).collect();
        assert_eq!(seen, [("a", 0), ("b", 0), ("c", 1)]);
    }
}
