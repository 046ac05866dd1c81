//! Tool calls streamed in fragments, merged by the `index` each fragment names: chat
//! completions' `delta.tool_calls` ([`super::openai::read_chunks`]) and LangChain's
//! `tool_call_chunks` as LangServe streams them (`protocol::jsonhttp`'s streams).
//!
//! The rule is LangChain's `AIMessageChunk.__add__` (`merge_lists`), which OpenAI's deltas
//! also follow: a fragment continues the latest call of its index whose id is unknown or the
//! same (a fragment with another id at that index begins a new call); the id and name come
//! from the fragments that have them (a repeat of the same id or name changes nothing), the
//! argument text of every fragment is appended. What the parts mean (a name never sent, text
//! that is not JSON) is the caller's to judge once the stream has ended. Pure: no I/O, no
//! panics on what a server sends.

/// One tool call assembled so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamedCall {
    /// The `index` its fragments name (`None`: a call that came without one).
    pub index: Option<u64>,
    /// Empty until a fragment brings one.
    pub id: String,
    pub name: String,
    /// The argument text of its fragments, joined.
    pub arguments: String,
}

/// What one fragment says about its call (`None` or `""`: nothing).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fragment<'a> {
    pub id: Option<&'a str>,
    pub name: Option<&'a str>,
    pub arguments: Option<&'a str>,
}

impl StreamedCall {
    /// A call begun by `fragment`.
    pub fn new(index: Option<u64>, fragment: Fragment<'_>) -> Self {
        let mut call = StreamedCall {
            index,
            ..Default::default()
        };
        call.add(fragment);
        call
    }

    /// Adds a fragment of this call.
    pub fn add(&mut self, fragment: Fragment<'_>) {
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            id.clone_into(&mut self.id);
        }
        if let Some(name) = fragment.name.filter(|n| !n.is_empty())
            && name != self.name
        {
            self.name.push_str(name);
        }
        if let Some(arguments) = fragment.arguments {
            self.arguments.push_str(arguments);
        }
    }
}

/// The calls of one streamed answer, in the order they began.
#[derive(Clone, Debug, Default)]
pub struct StreamedCalls {
    calls: Vec<StreamedCall>,
}

impl StreamedCalls {
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Adds a fragment of the call at `index` (see the module docs for which call that is)
    /// and returns that call's position.
    pub fn add(&mut self, index: u64, fragment: Fragment<'_>) -> usize {
        let id = fragment.id.filter(|id| !id.is_empty());
        let continued = self.calls.iter().rposition(|call| {
            call.index == Some(index) && (call.id.is_empty() || id.is_none_or(|id| id == call.id))
        });
        match continued {
            Some(position) => {
                self.calls[position].add(fragment);
                position
            }
            None => self.push(StreamedCall::new(Some(index), fragment)),
        }
    }

    /// Appends a call and returns its position.
    pub fn push(&mut self, call: StreamedCall) -> usize {
        self.calls.push(call);
        self.calls.len() - 1
    }

    /// The position of the call with this id.
    pub fn position_of_id(&self, id: &str) -> Option<usize> {
        self.calls.iter().rposition(|call| call.id == id)
    }

    pub fn get_mut(&mut self, position: usize) -> Option<&mut StreamedCall> {
        self.calls.get_mut(position)
    }

    pub fn into_calls(self) -> Vec<StreamedCall> {
        self.calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment<'a>(id: Option<&'a str>, name: Option<&'a str>, args: &'a str) -> Fragment<'a> {
        Fragment {
            id,
            name,
            arguments: Some(args),
        }
    }

    #[test]
    fn fragments_merge_by_index_taking_the_id_and_name_from_those_that_have_them() {
        let mut calls = StreamedCalls::default();
        calls.add(0, fragment(Some("call_1"), Some("book_flight"), ""));
        calls.add(1, fragment(Some("call_2"), Some("search"), "{}"));
        calls.add(0, fragment(None, None, "{\"destin"));
        calls.add(
            0,
            fragment(Some("call_1"), Some("book_flight"), "ation\": 1}"),
        );
        let calls = calls.into_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_1");
        assert_eq!(
            calls[0].name, "book_flight",
            "a repeated name is not doubled"
        );
        assert_eq!(calls[0].arguments, "{\"destination\": 1}");
        assert_eq!(calls[1].name, "search");
    }

    #[test]
    fn a_name_split_across_fragments_is_joined_and_another_id_begins_a_new_call() {
        let mut calls = StreamedCalls::default();
        calls.add(3, fragment(None, Some("book_"), "{"));
        calls.add(3, fragment(Some("a"), Some("flight"), "}"));
        calls.add(3, fragment(Some("b"), Some("cancel"), "{}"));
        calls.add(3, fragment(None, None, ""));
        let calls = calls.into_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].name.as_str()),
            ("a", "book_flight")
        );
        assert_eq!(calls[0].arguments, "{}");
        assert_eq!(
            (calls[1].id.as_str(), calls[1].name.as_str()),
            ("b", "cancel")
        );
        assert_eq!(calls[1].index, Some(3));
    }
}
