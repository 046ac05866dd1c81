//! Pairing tool calls with their results, shared by every protocol that reports both.
//!
//! A result names the call it answers by id, by function name, or not at all; agents reuse
//! ids and leave them out. The rule: the first unpaired call with the result's id (and its
//! function name, when the result gives one), else the first unpaired call of that name,
//! else the first unpaired call. Every lookup is a queue that drops paired entries as it
//! goes, so pairing is linear in the number of calls: an 8 MiB reply with tens of
//! thousands of calls must not stall the engine.

use std::collections::{HashMap, VecDeque};

use crate::record::ToolCallRecord;

/// A tool result as a protocol found it.
#[derive(Clone, Copy, Debug)]
pub struct ToolResult<'a> {
    pub call_id: Option<&'a str>,
    pub name: Option<&'a str>,
    pub content: Option<&'a str>,
}

/// Sets `result` on the call each result answers (see the module docs for the rule).
/// Results that answer no call (more results than calls) are dropped.
pub fn pair<'a>(calls: &mut [ToolCallRecord], results: impl IntoIterator<Item = ToolResult<'a>>) {
    if calls.is_empty() {
        return;
    }
    if calls.len() <= SMALL {
        pair_small(calls, results)
    } else {
        pair_mapped(calls, results)
    }
}

/// [`pair`] through queues keyed by id, id and name, and name: linear in the calls.
fn pair_mapped<'a>(
    calls: &mut [ToolCallRecord],
    results: impl IntoIterator<Item = ToolResult<'a>>,
) {
    let mut by_id: HashMap<&str, VecDeque<usize>> = HashMap::new();
    let mut by_id_name: HashMap<(&str, &str), VecDeque<usize>> = HashMap::new();
    let mut by_name: HashMap<&str, VecDeque<usize>> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        by_id.entry(call.call_id.as_str()).or_default().push_back(i);
        by_id_name
            .entry((call.call_id.as_str(), call.name.as_str()))
            .or_default()
            .push_back(i);
        by_name.entry(call.name.as_str()).or_default().push_back(i);
    }
    let mut paired = vec![false; calls.len()];
    let mut next_unpaired = 0usize;
    let mut slots: Vec<(usize, Option<String>)> = Vec::new();
    for result in results {
        let id = result.call_id.filter(|id| !id.is_empty());
        let slot = id
            .and_then(|id| match result.name {
                // An agent that reuses a call id still names the function its result is
                // for; a name that disagrees means the id is not to be trusted.
                Some(name) => first_unpaired(by_id_name.get_mut(&(id, name)), &paired),
                None => first_unpaired(by_id.get_mut(id), &paired),
            })
            .or_else(|| first_unpaired(by_name.get_mut(result.name?), &paired))
            .or_else(|| {
                while paired.get(next_unpaired).copied() == Some(true) {
                    next_unpaired += 1;
                }
                (next_unpaired < calls.len()).then_some(next_unpaired)
            });
        if let Some(slot) = slot
            && let Some(done) = paired.get_mut(slot)
        {
            *done = true;
            slots.push((slot, result.content.map(str::to_owned)));
        }
    }
    for (slot, content) in slots {
        if let Some(call) = calls.get_mut(slot) {
            call.result = content;
        }
    }
}

/// Below this many calls a linear scan beats building three hash maps (most turns make
/// one to three calls).
const SMALL: usize = 16;

/// [`pair`] by scanning: the same rule, quadratic, for a handful of calls.
fn pair_small<'a>(calls: &mut [ToolCallRecord], results: impl IntoIterator<Item = ToolResult<'a>>) {
    let mut paired = [false; SMALL];
    for result in results {
        let unpaired = |i: &usize| !paired.get(*i).copied().unwrap_or(true);
        let id = result.call_id.filter(|id| !id.is_empty());
        let slot = id
            .and_then(|id| {
                (0..calls.len()).filter(unpaired).find(|&i| {
                    calls[i].call_id == id && result.name.is_none_or(|n| n == calls[i].name)
                })
            })
            .or_else(|| {
                let name = result.name?;
                (0..calls.len())
                    .filter(unpaired)
                    .find(|&i| calls[i].name == name)
            })
            .or_else(|| (0..calls.len()).find(unpaired));
        if let Some(slot) = slot {
            paired[slot] = true;
            calls[slot].result = result.content.map(str::to_owned);
        }
    }
}

fn first_unpaired(queue: Option<&mut VecDeque<usize>>, paired: &[bool]) -> Option<usize> {
    let queue = queue?;
    while let Some(&i) = queue.front() {
        if paired.get(i).copied() == Some(false) {
            return Some(i);
        }
        queue.pop_front();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str) -> ToolCallRecord {
        ToolCallRecord {
            call_id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
            result: None,
        }
    }

    fn result<'a>(id: Option<&'a str>, name: Option<&'a str>, c: &'a str) -> ToolResult<'a> {
        ToolResult {
            call_id: id,
            name,
            content: Some(c),
        }
    }

    #[test]
    fn pairs_by_id_then_name_then_order() {
        let mut calls = vec![
            call("1", "a"),
            call("2", "b"),
            call("3", "c"),
            call("", "d"),
        ];
        pair(
            &mut calls,
            [
                result(Some("2"), None, "B"),
                result(None, Some("c"), "C"),
                result(None, None, "A"),
                result(Some("9"), None, "D"),
                result(None, None, "dropped"),
            ],
        );
        let got: Vec<_> = calls.iter().map(|c| c.result.as_deref()).collect();
        assert_eq!(got, [Some("A"), Some("B"), Some("C"), Some("D")]);
    }

    #[test]
    fn the_small_and_the_large_path_pair_alike() {
        let names = ["a", "b", "c", "a", "b"];
        for copies in [1, 10] {
            let mut calls: Vec<_> = (0..copies * names.len())
                .map(|i| call(&format!("id{}", i % 3), names[i % names.len()]))
                .collect();
            let results: Vec<(Option<String>, Option<&str>)> = (0..calls.len())
                .rev()
                .map(|i| {
                    let id = (i % 2 == 0).then(|| format!("id{}", i % 3));
                    (id, (i % 3 != 0).then_some(names[i % names.len()]))
                })
                .collect();
            let as_results = || {
                results
                    .iter()
                    .enumerate()
                    .map(|(j, (id, name))| ToolResult {
                        call_id: id.as_deref(),
                        name: *name,
                        content: Some(if j % 2 == 0 { "even" } else { "odd" }),
                    })
            };
            let mut scanned = calls.clone();
            if scanned.len() <= SMALL {
                pair_small(&mut scanned, as_results());
            }
            pair_mapped(&mut calls, as_results());
            assert!(calls.iter().all(|c| c.result.is_some()), "{copies}");
            if scanned.len() <= SMALL {
                assert_eq!(scanned, calls);
            }
        }
    }

    #[test]
    fn a_reused_id_pairs_by_name() {
        let mut calls = vec![call("x", "a"), call("x", "b")];
        pair(&mut calls, [result(Some("x"), Some("b"), "B")]);
        assert_eq!(calls[0].result, None);
        assert_eq!(calls[1].result.as_deref(), Some("B"));
    }

    #[test]
    fn fifty_thousand_calls_pair_in_linear_time() {
        let n = 50_000;
        let mut calls: Vec<_> = (0..n).map(|i| call("", &format!("f{}", i % 7))).collect();
        let names: Vec<String> = (0..n).map(|i| format!("f{}", (n - 1 - i) % 7)).collect();
        let started = std::time::Instant::now();
        pair(
            &mut calls,
            names.iter().map(|n| ToolResult {
                call_id: Some("unknown"),
                name: Some(n),
                content: Some("r"),
            }),
        );
        assert!(calls.iter().all(|c| c.result.is_some()));
        // Quadratic pairing took tens of seconds here; linear takes milliseconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
