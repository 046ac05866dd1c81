//! The agents file of a directory import (`OUT/agents.kdl`) when one is already there.
//!
//! That file is where a user points the imported suites at their agent (its header says
//! "edit the endpoints here"), so `--replace`, which rewrites the suites, must not undo that
//! edit: the suites would then run against the builtin reference agent and pass. The agents
//! it holds are kept as they are, byte for byte, and the import appends only the agents it
//! lacks. An agent the import reaches at an endpoint keeps the id the suite written for it
//! last time names (so an endpoint the user edited in the file stays theirs), else takes
//! the id of the file's agent at that endpoint, else a new id no agent of the file has (so
//! another import's agent is never reused for other files). An agent kept though the import would write it otherwise (an edited
//! endpoint, or another import's agent of the same id) is named, with what the import
//! would have written, so neither goes unnoticed. The one agent replaced is one the
//! command line names explicitly (`--agent-url` and the like), which is the user saying
//! where it is now.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

/// An `agents.kdl` as the import found it.
pub struct AgentsFile {
    text: String,
    agents: Vec<KnownAgent>,
}

/// One `agent` node of the file.
struct KnownAgent {
    id: String,
    /// `url=`, `command=`, `socket=` or `builtin=`, and its value.
    endpoint: Option<(String, String)>,
    /// Whether it has `request "task-only"` (MultiAgentEval's AgentV form).
    task_only: bool,
    /// The node's text in the file.
    span: Range<usize>,
}

/// An agent the import would write, and whether the command line named its endpoint.
pub struct WantedAgent {
    pub id: String,
    pub text: String,
    pub explicit: bool,
    /// For an agent that is another with a different `max-actions` (MultiAgentEval's
    /// per-cap agents): that agent's id, the text the import writes for it, and this one's
    /// cap. When the file has no agent `id` but holds that one edited, the agent added is
    /// the file's, with this id and cap: the suites of every cap run where the user pointed
    /// them.
    pub like: Option<(String, String, Option<u64>)>,
}

/// What became of each wanted agent in the merged file.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub text: String,
    /// Already in the file and kept as written there.
    pub kept: Vec<String>,
    /// Of those, the ones the import would have written otherwise, with that text.
    pub kept_otherwise: Vec<(String, String)>,
    /// Already in the file, rewritten as the command line asked.
    pub replaced: Vec<String>,
    /// Not in the file: appended.
    pub added: Vec<String>,
    /// Of those, the ones written as a copy of the file's agent of another cap (edited
    /// there): `(id, that agent's id)`.
    pub derived: Vec<(String, String)>,
}

impl AgentsFile {
    /// The file at `path`; `None` when there is none. A file that does not parse is an
    /// error: the import will not guess which agents it held.
    pub fn read(path: &Path) -> Result<Option<AgentsFile>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        AgentsFile::parse(text).map(Some).map_err(|e| {
            format!(
                "{} is not valid KDL ({e}); fix it (`trellis check {}` shows where) or \
                 remove it, and import again",
                path.display(),
                path.display()
            )
        })
    }

    fn parse(text: String) -> Result<AgentsFile, kdl::KdlError> {
        let document: kdl::KdlDocument = text.parse()?;
        let agents = document
            .nodes()
            .iter()
            .filter(|node| node.name().value() == "agent")
            .filter_map(|node| {
                let id = node.get(0)?.as_string()?.to_owned();
                let endpoint = ["url", "command", "socket", "builtin"]
                    .into_iter()
                    .find_map(|key| {
                        let value = node.get(key)?.as_string()?;
                        Some((key.to_owned(), value.to_owned()))
                    });
                let task_only = node.children().is_some_and(|children| {
                    children.nodes().iter().any(|child| {
                        child.name().value() == "request"
                            && child.get(0).and_then(kdl::KdlValue::as_string) == Some("task-only")
                    })
                });
                let span = node.span();
                let span = span.offset()..span.offset() + span.len();
                text.get(span.clone())?;
                Some(KnownAgent {
                    id,
                    endpoint,
                    task_only,
                    span,
                })
            })
            .collect();
        Ok(AgentsFile { text, agents })
    }

    /// Whether the file has an agent `id`.
    pub fn has(&self, id: &str) -> bool {
        self.agents.iter().any(|agent| agent.id == id)
    }

    /// The ids of the file's agents.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.agents.iter().map(|agent| agent.id.as_str())
    }

    /// The file's agent `like` as it is written there, when it differs from `written` (what
    /// the import writes for it), as agent `id` with `max-actions` set to `max_actions`
    /// (removed for `None`); `None` when the file has no such agent or has it as written.
    fn variant(
        &self,
        like: &str,
        written: &str,
        id: &str,
        max_actions: Option<u64>,
    ) -> Option<String> {
        let known = self.agents.iter().find(|known| known.id == like)?;
        let text = self.text.get(known.span.clone())?;
        if same_node(text, written) {
            return None;
        }
        // Edited in the node's text, so everything else stays as the user wrote it.
        let document: kdl::KdlDocument = text.parse().ok()?;
        let node = document.nodes().first()?;
        let range = |entry: &kdl::KdlEntry| {
            let span = entry.span();
            span.offset()..span.offset() + span.len()
        };
        let name = range(node.entry(0)?);
        let cap = max_actions.map(|max| format!("max-actions={max}"));
        let mut edits: Vec<(Range<usize>, String)> = vec![(name, super::kdl_string(id))];
        match (node.entry("max-actions").map(range), cap) {
            (Some(at), Some(cap)) => edits.push((at, cap)),
            (Some(at), None) => edits.push((at, String::new())),
            (None, Some(cap)) => {
                let end = node.entries().iter().map(|e| range(e).end).max()?;
                edits.push((end..end, format!(" {cap}")));
            }
            (None, None) => {}
        }
        edits.sort_by_key(|(at, _)| std::cmp::Reverse(at.start));
        let mut out = text.to_owned();
        for (at, with) in edits {
            out.get(at.clone())?;
            out.replace_range(at, &with);
        }
        Some(out)
    }

    /// The id of the file's agent reached at `key=value` in the same request form.
    pub fn id_at(&self, key: &str, value: &str, task_only: bool) -> Option<&str> {
        self.agents
            .iter()
            .find(|agent| {
                agent.task_only == task_only
                    && agent
                        .endpoint
                        .as_ref()
                        .is_some_and(|(k, v)| k == key && v == value)
            })
            .map(|agent| agent.id.as_str())
    }

    /// The file with `wanted` merged in (see the module documentation).
    pub fn merge(&self, wanted: &[WantedAgent]) -> Merged {
        let mut merged = Merged::default();
        let mut replacements: Vec<(Range<usize>, &str)> = Vec::new();
        let mut appended = String::new();
        for agent in wanted {
            match self.agents.iter().find(|known| known.id == agent.id) {
                Some(known) => {
                    let written = self.text.get(known.span.clone()).unwrap_or_default();
                    if agent.explicit && !same_node(written, &agent.text) {
                        replacements.push((known.span.clone(), agent.text.trim_end()));
                        merged.replaced.push(agent.id.clone());
                    } else {
                        if !same_node(written, &agent.text) {
                            merged
                                .kept_otherwise
                                .push((agent.id.clone(), agent.text.trim_end().to_owned()));
                        }
                        merged.kept.push(agent.id.clone());
                    }
                }
                None => {
                    let derived = agent.like.as_ref().filter(|_| !agent.explicit).and_then(
                        |(like, written, max_actions)| {
                            self.variant(like, written, &agent.id, *max_actions)
                        },
                    );
                    if derived.is_some()
                        && let Some((like, _, _)) = &agent.like
                    {
                        merged.derived.push((agent.id.clone(), like.clone()));
                    }
                    let text = derived.as_deref().unwrap_or(&agent.text);
                    appended.push_str(text.trim_end());
                    appended.push('\n');
                    merged.added.push(agent.id.clone());
                }
            }
        }
        let mut text = self.text.clone();
        replacements.sort_by_key(|(span, _)| std::cmp::Reverse(span.start));
        for (span, with) in replacements {
            // A node's span ends after its last token, spaces included: keep the one
            // before a comment on its line.
            let trailing = self
                .text
                .get(span.clone())
                .map_or(0, |node| node.len() - node.trim_end().len());
            text.replace_range(span.start..span.end - trailing, with);
        }
        if !appended.is_empty() {
            // In the file's own line endings.
            let newline = if self.text.contains("\r\n") {
                "\r\n"
            } else {
                "\n"
            };
            if !text.is_empty() && !text.ends_with('\n') {
                text.push_str(newline);
            }
            text.push_str(&appended.replace('\n', newline));
        }
        merged.text = text;
        merged
    }
}

impl Merged {
    /// One line for the console about what an existing agents file kept, or `None` when
    /// the file was written from nothing.
    pub fn note(&self, path: &Path) -> String {
        let list = |ids: &[String]| {
            ids.iter()
                .map(|id| format!("`{id}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if !self.kept.is_empty() {
            parts.push(format!("kept {} as written there", list(&self.kept)));
        }
        if !self.replaced.is_empty() {
            parts.push(format!(
                "rewrote {} with the endpoint given",
                list(&self.replaced)
            ));
        }
        if !self.added.is_empty() {
            parts.push(format!("added {}", list(&self.added)));
        }
        for (id, like) in &self.derived {
            parts.push(format!(
                "wrote `{id}` as `{like}` is written there, with its own max-actions"
            ));
        }
        if parts.is_empty() {
            parts.push("left it as it was".to_owned());
        }
        let mut note = format!(
            "note: {} existed: {}; its other agents stay",
            path.display(),
            parts.join("; ")
        );
        for (id, text) in &self.kept_otherwise {
            let _ = write!(
                note,
                "\n  `{id}` differs from what this import would write, `{text}`: edit the \
                 file if the suites should run there"
            );
        }
        note
    }
}

/// Whether two agent nodes are written the same, spaces aside (a node's span holds no
/// comment after it).
fn same_node(written: &str, text: &str) -> bool {
    written.split_whitespace().eq(text.split_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> AgentsFile {
        match AgentsFile::parse(text.to_owned()) {
            Ok(file) => file,
            Err(e) => panic!("{e}"),
        }
    }

    fn wanted(id: &str, text: &str, explicit: bool) -> WantedAgent {
        WantedAgent {
            id: id.into(),
            text: text.into(),
            explicit,
            like: None,
        }
    }

    const EDITED: &str = "// header\n\nagent \"a\" protocol=\"multiagent\" url=\"http://mine\" // edited\nagent \"a-2\" protocol=\"multiagent\" url=\"http://x\" {\n    request \"task-only\"\n}\n";

    #[test]
    fn keeps_edited_agents_and_adds_missing_ones() {
        let merged = file(EDITED).merge(&[
            wanted(
                "a",
                "agent \"a\" protocol=\"multiagent\" builtin=\"support\"\n",
                false,
            ),
            wanted(
                "b",
                "agent \"b\" protocol=\"multiagent\" url=\"http://b\"\n",
                false,
            ),
        ]);
        assert_eq!(
            merged.text,
            format!("{EDITED}agent \"b\" protocol=\"multiagent\" url=\"http://b\"\n")
        );
        assert_eq!(merged.kept, ["a"]);
        assert_eq!(merged.added, ["b"]);
        assert_eq!(merged.kept_otherwise.len(), 1, "the edited url is named");
        assert!(merged.note(Path::new("x")).contains("builtin=\"support\""));
        assert!(merged.replaced.is_empty());
    }

    #[test]
    fn an_explicit_endpoint_rewrites_its_agent_only() {
        let merged = file(EDITED).merge(&[wanted(
            "a",
            "agent \"a\" protocol=\"multiagent\" url=\"http://new\"\n",
            true,
        )]);
        assert_eq!(
            merged.text,
            EDITED.replace("url=\"http://mine\"", "url=\"http://new\"")
        );
        assert_eq!(merged.replaced, ["a"]);
    }

    #[test]
    fn finds_agents_by_endpoint_and_form() {
        let file = file(EDITED);
        assert_eq!(file.id_at("url", "http://x", true), Some("a-2"));
        assert_eq!(file.id_at("url", "http://x", false), None);
        assert_eq!(file.id_at("url", "http://mine", false), Some("a"));
    }

    #[test]
    fn an_agent_of_another_cap_copies_the_edited_one() {
        let like = (
            "a".to_owned(),
            "agent \"a\" protocol=\"multiagent\" builtin=\"support\"\n".to_owned(),
            Some(3),
        );
        let merged = file(EDITED).merge(&[WantedAgent {
            id: "a-max-3".into(),
            text: "agent \"a-max-3\" protocol=\"multiagent\" builtin=\"support\" max-actions=3\n"
                .into(),
            explicit: false,
            like: Some(like.clone()),
        }]);
        assert!(
            merged.text.ends_with(
                "agent \"a-max-3\" protocol=\"multiagent\" url=\"http://mine\" max-actions=3\n"
            ),
            "{}",
            merged.text
        );
        assert_eq!(merged.added, ["a-max-3"]);
        assert_eq!(merged.derived, [("a-max-3".to_owned(), "a".to_owned())]);
        // An agent the file holds as the import writes it is not copied.
        let plain = file("agent \"a\" protocol=\"multiagent\" builtin=\"support\"\n");
        let merged = plain.merge(&[WantedAgent {
            id: "a-max-3".into(),
            text: "agent \"a-max-3\" protocol=\"multiagent\" builtin=\"support\" max-actions=3\n"
                .into(),
            explicit: false,
            like: Some(like),
        }]);
        assert!(merged.derived.is_empty());
    }

    #[test]
    fn a_file_that_does_not_parse_is_refused() {
        assert!(AgentsFile::parse("agent \"a\" {".to_owned()).is_err());
    }
}
