//! The simulated user: an LLM playing the persona writes the user side of `simulate` steps.
//!
//! It is told the persona (type, description, instructions), the user context as JSON (as
//! Connexity's prompt builder writes it), the scenario's description and the suite's
//! `simulator instructions`, and sees the conversation so far with the roles turned around
//! (its own messages as `assistant`, the agent's replies as `user`). It ends the
//! conversation by writing [`END_MARKER`]: alone (nothing more is sent) or after its last
//! message (that message is sent, then the simulation stops).
//!
//! The three messages the engine writes itself (the system prompt, the opening ask and the
//! retry note) are minijinja templates: the built-in ones ([`DEFAULT_SYSTEM_PROMPT`],
//! [`DEFAULT_OPENING_PROMPT`], [`DEFAULT_RETRY_PROMPT`]), or a suite's `system-prompt`,
//! `opening-prompt` and `retry-prompt`, the innermost simulator layer's winning
//! ([`Layered`]). They render in the plan's template environment (strict undefined
//! variables, fuel), so a bad one is a `simulator` fault, never a panic.
//!
//! An empty answer, or one that is only a role prefix, is asked again (with a note saying
//! so, which makes the retry a different request for the cache) up to
//! [`SIMULATOR_RETRIES`] times; then the trajectory gets a `simulator` fault.

use std::collections::BTreeMap;

use minijinja::Value as TemplateValue;
use minijinja::value::Serde;
use serde_json::{Map, Value};
use trellis_dsl::{Simulator, Template};

use super::judge::PersonaInfo;
use super::{LlmMessage, LlmRequest};
use crate::record::TurnRecord;
use crate::render::{RenderError, ScenarioScope, Templates};

/// What the simulated user writes to end the conversation.
pub const END_MARKER: &str = "[END]";

/// Retries of an empty or malformed simulator answer before the trajectory faults.
pub const SIMULATOR_RETRIES: usize = 2;

/// Turns a `simulate until-done` takes at most when the scenario sets no `max-turns`.
pub const UNTIL_DONE_CAP: u32 = 20;

/// Tools an agent calls to end the conversation itself: Connexity's voice agents hang up with
/// an `end_call` tool. A turn with such a call ends the `simulate` step after that turn.
pub const AGENT_END_TOOLS: &[&str] = &["end_call", "end_conversation"];

/// The built-in `system-prompt`. `is not none` (not plain truthiness) keeps an empty
/// description or instruction written as before.
pub const DEFAULT_SYSTEM_PROMPT: &str = concat!(
    "You are role-playing the USER in a conversation with an AI agent, to test the agent. ",
    "Stay in character. Write only the user's next message: plain text as the user would ",
    "type it, no quotes, no role name, no commentary.\n",
    "{% if persona is not none %}\nYour persona: {{ persona.type }}\n",
    "{% if persona.description is not none %}Who you are: {{ persona.description }}\n{% endif %}",
    "{% if persona.instructions is not none %}How you behave: {{ persona.instructions }}\n",
    "{% endif %}{% endif %}",
    "{% if user_context %}\nWhat you know (user context, JSON):\n{{ user_context_json }}\n",
    "{% endif %}",
    "{% if description is not none %}\nThe situation: {{ description }}\n{% endif %}",
    "{% if instructions is not none %}\n{{ instructions }}\n{% endif %}",
    "\nWhen your goal is reached or the conversation is over, write {{ end_marker }} (alone, or ",
    "at the end of your last message).",
);

/// The built-in `opening-prompt`: the first `user` message, when there is no conversation yet.
pub const DEFAULT_OPENING_PROMPT: &str =
    "(The conversation starts: write your first message to the agent.)";

/// The built-in `retry-prompt`: the note after an unusable answer (`retry` counts from 1).
pub const DEFAULT_RETRY_PROMPT: &str = "(Your previous answer was empty or not a message \
     (retry {{ retry }}). Write the user's next message, or {{ end_marker }}.)";

/// Whether the agent ended the conversation in this turn (called one of [`AGENT_END_TOOLS`]).
pub fn agent_ended(turn: &TurnRecord) -> bool {
    turn.tool_calls
        .iter()
        .any(|call| AGENT_END_TOOLS.contains(&call.name.as_str()))
}

/// The simulator a `simulate` step uses, from its layers: the branch's and scenario's
/// `simulator` (innermost first), then the project's.
///
/// - `provider`: the innermost layer naming one; `model` and `temperature`: the innermost
///   set among the layers down to that one (a layer naming a provider starts afresh, as a
///   model of one provider means nothing on another);
/// - each prompt template: the innermost layer's, else the built-in one;
/// - `instructions`: every layer's, outermost first (a branch adds to the suite's rules).
#[derive(Clone, Debug)]
pub struct Layered<'a> {
    /// `None`: no layer names one (the project's lone provider plays the user, if any).
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
    pub temperature: Option<f64>,
    pub prompts: PromptTemplates<'a>,
    /// Outermost first.
    pub instructions: Vec<&'a Template>,
    /// `fidelity`: the innermost layer's; `None` means the default (guards on, the judge
    /// when one exists).
    pub fidelity: Option<bool>,
    /// `retries-invalid`: the innermost layer's, else 0.
    pub retries_invalid: u32,
}

impl<'a> Layered<'a> {
    /// `step`: the step's own simulator (with its enclosing layers); `project`: the default.
    pub fn new(step: Option<&'a Simulator>, project: Option<&'a Simulator>) -> Self {
        let layers: Vec<&Simulator> = step
            .into_iter()
            .flat_map(Simulator::layers)
            .chain(project)
            .collect();
        let naming = layers.iter().position(|l| l.provider.is_some());
        let connection = layers.iter().take(naming.map_or(layers.len(), |i| i + 1));
        let prompt = |pick: fn(&Simulator) -> Option<&Template>, default: &'static str| {
            layers
                .iter()
                .find_map(|l| pick(l))
                .map_or(default, |t| t.source.as_str())
        };
        Layered {
            provider: layers
                .iter()
                .find_map(|l| l.provider.as_ref())
                .map(|p| p.value.as_str()),
            model: connection.clone().find_map(|l| l.model.as_deref()),
            temperature: connection.clone().find_map(|l| l.temperature),
            prompts: PromptTemplates {
                system: prompt(|l| l.system_prompt.as_ref(), DEFAULT_SYSTEM_PROMPT),
                opening: prompt(|l| l.opening_prompt.as_ref(), DEFAULT_OPENING_PROMPT),
                retry: prompt(|l| l.retry_prompt.as_ref(), DEFAULT_RETRY_PROMPT),
            },
            instructions: layers
                .iter()
                .rev()
                .filter_map(|l| l.instructions.as_ref())
                .collect(),
            fidelity: layers.iter().find_map(|l| l.fidelity),
            retries_invalid: layers.iter().find_map(|l| l.retries_invalid).unwrap_or(0),
        }
    }
}

/// The templates (sources) the simulator's own messages are written from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptTemplates<'a> {
    pub system: &'a str,
    pub opening: &'a str,
    pub retry: &'a str,
}

impl Default for PromptTemplates<'static> {
    fn default() -> Self {
        PromptTemplates {
            system: DEFAULT_SYSTEM_PROMPT,
            opening: DEFAULT_OPENING_PROMPT,
            retry: DEFAULT_RETRY_PROMPT,
        }
    }
}

/// A prompt template that failed to render: the `simulator` fault of that trajectory.
#[derive(Debug, thiserror::Error)]
#[error("the simulator's {prompt}: {error}")]
pub struct PromptError {
    /// Which one (`system-prompt`, `instructions`…).
    pub prompt: &'static str,
    #[source]
    pub error: RenderError,
}

/// What the simulator knows about the user it plays.
#[derive(Clone, Debug, Default)]
pub struct Character<'a> {
    pub persona: Option<PersonaInfo>,
    pub user_context: Option<&'a Map<String, Value>>,
    pub description: Option<&'a str>,
    /// The simulator's `instructions`, rendered.
    pub instructions: Option<String>,
    /// The scenario's template scope and the captures so far (`scenario`, `env`, `vars`).
    pub scope: Option<(&'a ScenarioScope, &'a BTreeMap<String, String>)>,
    /// The scenario's recorded `history`: the conversation so far, before its first turn.
    pub history: &'a [Value],
}

/// The recorded `history` with the roles turned around, as the simulator reads turns: the
/// user's messages are its own (assistant), the agent's answers what it reads (user). Tool
/// calls and results are the agent's business, not the user's.
fn history_messages(history: &[Value]) -> impl Iterator<Item = LlmMessage> + '_ {
    history.iter().filter_map(|m| {
        let content = m.get("content").and_then(Value::as_str)?;
        match m.get("role").and_then(Value::as_str)? {
            "user" => Some(LlmMessage::assistant(content.to_owned())),
            "assistant" if !content.is_empty() => Some(LlmMessage::user(content.to_owned())),
            _ => None,
        }
    })
}

impl Character<'_> {
    /// Who the user is, in a few lines: what the fidelity judge holds the simulated user's
    /// messages against.
    pub fn brief(&self) -> String {
        let mut out = Vec::new();
        if let Some(p) = &self.persona {
            out.push(format!("Persona: {}", p.kind));
            if let Some(d) = p.description.as_deref().filter(|d| !d.is_empty()) {
                out.push(format!("Who they are: {d}"));
            }
            if let Some(i) = p.instructions.as_deref().filter(|i| !i.is_empty()) {
                out.push(format!("How they behave: {i}"));
            }
        }
        if let Some(uc) = self.user_context.filter(|m| !m.is_empty()) {
            out.push(format!(
                "What they know (JSON): {}",
                serde_json::to_string(uc).unwrap_or_default()
            ));
        }
        if let Some(d) = self.description.filter(|d| !d.is_empty()) {
            out.push(format!("The situation: {d}"));
        }
        if let Some(i) = self.instructions.as_deref().filter(|i| !i.is_empty()) {
            out.push(format!("Their instructions: {i}"));
        }
        if out.is_empty() {
            out.push("(no persona, user context or situation was given)".to_owned());
        }
        out.join("\n")
    }

    /// The variables the prompt templates see (`retry`: 0 for the first ask).
    fn variables(&self, retry: usize) -> TemplateValue {
        let persona = self.persona.as_ref().map(|p| {
            serde_json::json!({
                "type": p.kind,
                "description": p.description,
                "instructions": p.instructions,
            })
        });
        let empty = Map::new();
        let user_context = self.user_context.unwrap_or(&empty);
        let user_context_json = if user_context.is_empty() {
            String::new()
        } else {
            serde_json::to_string_pretty(user_context).unwrap_or_default()
        };
        let extra: BTreeMap<String, TemplateValue> = [
            ("persona", TemplateValue::from(Serde(&persona))),
            ("user_context", TemplateValue::from(Serde(user_context))),
            ("user_context_json", TemplateValue::from(user_context_json)),
            ("description", TemplateValue::from(self.description)),
            (
                "instructions",
                TemplateValue::from(self.instructions.clone()),
            ),
            ("end_marker", TemplateValue::from(END_MARKER)),
            ("retry", TemplateValue::from(retry)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        match self.scope {
            Some((scope, vars)) => scope.with_vars_and(vars, extra),
            None => TemplateValue::from(extra),
        }
    }
}

/// The simulator's request for the next user message, its messages rendered from `prompts`.
/// `retry` (0 for the first ask) adds the retry note about the previous unusable answer.
pub fn request<T: AsRef<TurnRecord>>(
    templates: &Templates,
    prompts: &PromptTemplates<'_>,
    character: &Character<'_>,
    turns: &[T],
    retry: usize,
) -> Result<LlmRequest, PromptError> {
    let render = |prompt: &'static str, source: &str| {
        templates
            .render_source(source, || character.variables(retry))
            .map_err(|error| PromptError { prompt, error })
    };
    let mut messages = vec![LlmMessage::system(render("system-prompt", prompts.system)?)];
    messages.extend(history_messages(character.history));
    for t in turns.iter().map(AsRef::as_ref) {
        if !t.user_message.is_empty() {
            messages.push(LlmMessage::assistant(t.user_message.clone()));
        }
        messages.push(LlmMessage::user(
            t.reply.clone().unwrap_or_else(|| "(no answer)".to_owned()),
        ));
    }
    if messages.len() == 1 {
        messages.push(LlmMessage::user(render("opening-prompt", prompts.opening)?));
    }
    if retry > 0 {
        messages.push(LlmMessage::user(render("retry-prompt", prompts.retry)?));
    }
    Ok(LlmRequest {
        messages,
        ..LlmRequest::default()
    })
}

/// Renders each layer's `instructions` (outermost first) in the scenario's scope and joins
/// them with a blank line; `None` when no layer has any.
pub fn instructions(
    templates: &Templates,
    layers: &[&Template],
    scope: &ScenarioScope,
    vars: &BTreeMap<String, String>,
) -> Result<Option<String>, PromptError> {
    let mut rendered = Vec::with_capacity(layers.len());
    for template in layers {
        let text = templates
            .render_source(&template.source, || scope.with_vars(vars))
            .map_err(|error| PromptError {
                prompt: "instructions",
                error,
            })?;
        rendered.push(text);
    }
    Ok((!rendered.is_empty()).then(|| rendered.join("\n\n")))
}

/// What the simulator's answer means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Said {
    /// Send this message and go on.
    Message(String),
    /// Send this message, then end the conversation.
    Last(String),
    /// End the conversation without another message.
    End,
    /// Nothing usable: ask again.
    Unusable,
}

/// Reads the simulator's answer: role prefixes and wrapping quotes removed, the end marker
/// found anywhere.
pub fn interpret(text: &str) -> Said {
    // Small models continue the transcript past their own line ("…\nAgent: Sure!"): what
    // follows the other side's label is not the user's message.
    let own: String = text
        .lines()
        .take_while(|line| !speaker_is_the_agent(line))
        .collect::<Vec<_>>()
        .join("\n");
    let (without, ended) = without_end_marker(&own);
    let mut message = without.trim();
    loop {
        let trimmed = message.trim_start_matches(['*', '_']).trim_start();
        let Some(rest) = ["user:", "customer:", "caller:", "me:"]
            .iter()
            .find_map(|p| {
                trimmed
                    .get(..p.len())
                    .filter(|head| head.eq_ignore_ascii_case(p))
                    .map(|_| &trimmed[p.len()..])
            })
        else {
            break;
        };
        message = rest.trim_start_matches(['*', '_']).trim();
    }
    let message = message
        .strip_prefix('"')
        .and_then(|m| m.strip_suffix('"'))
        .unwrap_or(message)
        .trim();
    match (message.is_empty(), ended) {
        (true, true) => Said::End,
        (true, false) => Said::Unusable,
        (false, true) => Said::Last(message.to_owned()),
        (false, false) => Said::Message(message.to_owned()),
    }
}

/// Whether `line` opens the agent's side of a transcript (`Agent:`, `**Assistant:**`, …).
fn speaker_is_the_agent(line: &str) -> bool {
    let line = line.trim_start().trim_start_matches(['*', '_']);
    ["agent:", "assistant:", "ai:", "bot:", "support:"]
        .iter()
        .any(|label| {
            line.get(..label.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(label))
        })
}

/// `text` without the end marker (in any letter case: `[end]` too), and whether it had one.
/// The markup and punctuation a model wraps it in go with it (`**[END]**`, `` `[END]` ``,
/// `[END].`): left, the agent was sent `** **` or a lone `.` as the user's words.
fn without_end_marker(text: &str) -> (String, bool) {
    let lower = text.to_ascii_lowercase();
    let marker = END_MARKER.to_ascii_lowercase();
    if !lower.contains(&marker) {
        return (text.to_owned(), false);
    }
    // ASCII lower-casing keeps byte offsets, so the marker's places in `lower` are its
    // places in `text`.
    const WRAPS: [char; 3] = ['*', '_', '`'];
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    for (at, _) in lower.match_indices(&marker) {
        if at < rest {
            continue;
        }
        let before = text[rest..at].trim_end_matches(WRAPS);
        out.push_str(&text[rest..rest + before.len()]);
        out.push(' ');
        let after = &text[at + marker.len()..];
        let tail = after
            .trim_start_matches(WRAPS)
            .trim_start_matches(['.', '!', '?'])
            .trim_start_matches(WRAPS);
        rest = text.len() - tail.len();
    }
    out.push_str(&text[rest..]);
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_models_transcript_is_cut_to_the_users_line() {
        assert_eq!(
            interpret("**User:** I need a cleaning.\nAgent: Sure, where?\nUser: V4T"),
            Said::Message("I need a cleaning.".into())
        );
        assert_eq!(interpret("Assistant: How can I help?"), Said::Unusable);
        assert_eq!(interpret("Thanks! [end]"), Said::Last("Thanks!".into()));
        assert_eq!(
            interpret("customer: Tuesday, please. [END]\nAI: Booked."),
            Said::Last("Tuesday, please.".into())
        );
        assert_eq!(
            interpret("Ünïcode ok: Straße"),
            Said::Message("Ünïcode ok: Straße".into())
        );
    }

    #[test]
    fn answers_are_cleaned_and_the_end_marker_is_found() {
        assert_eq!(
            interpret("User: \"Hi there\""),
            Said::Message("Hi there".into())
        );
        assert_eq!(
            interpret("Thanks, bye! [END]"),
            Said::Last("Thanks, bye!".into())
        );
        assert_eq!(interpret(" [END] "), Said::End);
        // The markup and punctuation around the marker go with it.
        for text in [
            "Thanks, that's all! **[END]**",
            "Thanks, that's all! [END].",
            "Thanks, that's all! `[END]`",
            "Thanks, that's all! _[end]_!",
        ] {
            assert_eq!(
                interpret(text),
                Said::Last("Thanks, that's all!".into()),
                "{text}"
            );
        }
        assert_eq!(interpret("**[END]**"), Said::End);
        assert_eq!(interpret("User:"), Said::Unusable);
        assert_eq!(interpret("   "), Said::Unusable);
    }

    fn built_in<T: AsRef<TurnRecord>>(
        character: &Character<'_>,
        turns: &[T],
        retry: usize,
    ) -> LlmRequest {
        match request(
            &Templates::default(),
            &PromptTemplates::default(),
            character,
            turns,
            retry,
        ) {
            Ok(request) => request,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_recorded_history_opens_the_simulators_conversation_roles_turned_around() {
        let history = vec![
            serde_json::json!({"role": "user", "content": "My order is A-1."}),
            serde_json::json!({"role": "tool", "content": "{}"}),
            serde_json::json!({"role": "assistant", "content": "Got it."}),
        ];
        let character = Character {
            history: &history,
            ..Character::default()
        };
        let r = built_in(&character, &[] as &[TurnRecord], 0);
        // No "the conversation starts" prompt: it is under way.
        assert_eq!(
            r.messages[1..],
            [
                LlmMessage::assistant("My order is A-1."),
                LlmMessage::user("Got it.")
            ],
            "{:?}",
            r.messages
        );
    }

    #[test]
    fn roles_are_turned_around_and_a_retry_is_another_request() {
        let turn = TurnRecord {
            user_message: "Hi".into(),
            reply: Some("Hello, how can I help?".into()),
            ..TurnRecord::default()
        };
        let character = Character {
            persona: Some(PersonaInfo {
                kind: "busy-parent".into(),
                description: None,
                instructions: Some("Be brief".into()),
            }),
            ..Character::default()
        };
        let first = built_in(&character, std::slice::from_ref(&turn), 0);
        let roles: Vec<_> = first.messages.iter().map(|m| m.role).collect();
        use super::super::Role::*;
        assert_eq!(roles, [System, Assistant, User]);
        assert!(first.messages[0].content.contains("Be brief"));
        assert!(first.messages[0].content.contains(END_MARKER));
        assert_ne!(built_in(&character, &[turn], 1), first);
        let opening = built_in(&character, &[] as &[TurnRecord], 0);
        assert_eq!(opening.messages.last().map(|m| m.role), Some(User));
    }

    /// The prompt as the engine wrote it in code before it became templates: the built-in
    /// templates must give exactly this, so `--llm-cache` entries stay valid.
    fn written_in_code<T: AsRef<TurnRecord>>(
        character: &Character<'_>,
        turns: &[T],
        retry: usize,
    ) -> LlmRequest {
        use std::fmt::Write as _;
        let mut system = String::from(
            "You are role-playing the USER in a conversation with an AI agent, to test the agent. \
             Stay in character. Write only the user's next message: plain text as the user would \
             type it, no quotes, no role name, no commentary.\n",
        );
        if let Some(p) = &character.persona {
            let _ = writeln!(system, "\nYour persona: {}", p.kind);
            if let Some(d) = &p.description {
                let _ = writeln!(system, "Who you are: {d}");
            }
            if let Some(i) = &p.instructions {
                let _ = writeln!(system, "How you behave: {i}");
            }
        }
        if let Some(uc) = character.user_context.filter(|m| !m.is_empty()) {
            let _ = writeln!(
                system,
                "\nWhat you know (user context, JSON):\n{}",
                serde_json::to_string_pretty(uc).unwrap_or_default()
            );
        }
        if let Some(d) = character.description {
            let _ = writeln!(system, "\nThe situation: {d}");
        }
        if let Some(i) = &character.instructions {
            let _ = writeln!(system, "\n{i}");
        }
        let _ = write!(
            system,
            "\nWhen your goal is reached or the conversation is over, write {END_MARKER} (alone, or \
             at the end of your last message)."
        );
        let mut messages = vec![LlmMessage::system(system)];
        messages.extend(history_messages(character.history));
        for t in turns.iter().map(AsRef::as_ref) {
            if !t.user_message.is_empty() {
                messages.push(LlmMessage::assistant(t.user_message.clone()));
            }
            messages.push(LlmMessage::user(
                t.reply.clone().unwrap_or_else(|| "(no answer)".to_owned()),
            ));
        }
        if messages.len() == 1 {
            messages.push(LlmMessage::user(
                "(The conversation starts: write your first message to the agent.)",
            ));
        }
        if retry > 0 {
            messages.push(LlmMessage::user(format!(
                "(Your previous answer was empty or not a message (retry {retry}). Write the user's \
                 next message, or {END_MARKER}.)"
            )));
        }
        LlmRequest {
            messages,
            ..LlmRequest::default()
        }
    }

    #[test]
    fn the_built_in_templates_write_the_prompt_the_code_wrote() {
        let context: Map<String, Value> = serde_json::from_str(
            r#"{"name": "Ada", "postal_code": "V4T 0A7", "items": [1, {"a": null}], "n": 2.5}"#,
        )
        .unwrap_or_default();
        let empty = Map::new();
        let personas = [
            None,
            Some(PersonaInfo {
                kind: "busy-parent".into(),
                description: Some("Homeowner, {{ not a template }}".into()),
                instructions: Some("Be brief.\nVery brief.".into()),
            }),
            Some(PersonaInfo {
                kind: "x".into(),
                description: Some(String::new()),
                instructions: None,
            }),
        ];
        let turn = TurnRecord {
            user_message: "Hi".into(),
            reply: None,
            ..TurnRecord::default()
        };
        let mut compared = 0;
        for persona in &personas {
            for user_context in [None, Some(&empty), Some(&context)] {
                for description in [None, Some("Booking a cleaning <today> & \"soon\"")] {
                    for instructions in [None, Some("Keep it short.".to_owned())] {
                        let character = Character {
                            persona: persona.clone(),
                            user_context,
                            description,
                            instructions,
                            scope: None,
                            history: &[],
                        };
                        for turns in [&[][..], std::slice::from_ref(&turn)] {
                            for retry in [0, 2] {
                                assert_eq!(
                                    built_in(&character, turns, retry),
                                    written_in_code(&character, turns, retry),
                                    "{character:?} retry {retry}"
                                );
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(compared, 3 * 3 * 2 * 2 * 2 * 2);
    }

    #[test]
    fn a_suite_template_sees_the_simulator_variables() {
        let prompts = PromptTemplates {
            system: "{{ persona.type }}|{{ user_context.name }}|{{ description }}|\
                     {{ instructions }}|{{ end_marker }}|{{ retry }}",
            opening: "Go.",
            retry: "again {{ retry }}",
        };
        let context: Map<String, Value> =
            serde_json::from_str(r#"{"name": "Ada"}"#).unwrap_or_default();
        let character = Character {
            persona: Some(PersonaInfo {
                kind: "p".into(),
                description: None,
                instructions: None,
            }),
            user_context: Some(&context),
            description: Some("d"),
            instructions: Some("i".into()),
            scope: None,
            history: &[],
        };
        let templates = Templates::default();
        let got = request(&templates, &prompts, &character, &[] as &[TurnRecord], 1)
            .map(|r| {
                r.messages
                    .into_iter()
                    .map(|m| m.content)
                    .collect::<Vec<_>>()
            })
            .map_err(|e| e.to_string());
        assert_eq!(
            got,
            Ok(vec![
                "p|Ada|d|i|[END]|1".to_owned(),
                "Go.".into(),
                "again 1".into()
            ])
        );
        let unknown = PromptTemplates {
            system: "{{ nobody.knows }}",
            ..prompts
        };
        let err = request(&templates, &unknown, &character, &[] as &[TurnRecord], 0)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(e) if e.starts_with("the simulator's system-prompt: ") && e.contains("undefined")),
            "{err:?}"
        );
    }

    fn layer(provider: Option<&str>, model: Option<&str>, instructions: Option<&str>) -> Simulator {
        let span = trellis_dsl::Span::new(0, (0..0).into());
        Simulator {
            provider: provider.map(|p| trellis_dsl::Spanned::new(p.to_owned(), span)),
            model: model.map(str::to_owned),
            temperature: None,
            instructions: instructions.map(|source| Template {
                source: source.to_owned(),
                span,
            }),
            system_prompt: None,
            opening_prompt: None,
            retry_prompt: None,
            fidelity: None,
            retries_invalid: None,
            outer: None,
            span,
        }
    }

    #[test]
    fn layers_resolve_innermost_first_and_instructions_accumulate() {
        let project = layer(Some("p"), Some("big"), Some("Suite rule."));
        let scenario = std::sync::Arc::new(layer(None, Some("small"), None));
        let mut branch = layer(None, None, Some("Be impatient."));
        branch.system_prompt = Some(Template {
            source: "custom".into(),
            span: branch.span,
        });
        let step = branch.over(&scenario);
        let got = Layered::new(Some(&step), Some(&project));
        assert_eq!(
            (
                got.provider,
                got.model,
                got.prompts.system,
                got.prompts.opening
            ),
            (Some("p"), Some("small"), "custom", DEFAULT_OPENING_PROMPT)
        );
        let instructions: Vec<&str> = got.instructions.iter().map(|t| t.source.as_str()).collect();
        assert_eq!(instructions, ["Suite rule.", "Be impatient."]);
        // A layer naming another provider does not inherit the project's model.
        let other = layer(Some("q"), None, None);
        let got = Layered::new(Some(&other), Some(&project));
        assert_eq!((got.provider, got.model), (Some("q"), None));
        let none = Layered::new(None, None);
        assert_eq!(
            (none.provider, none.prompts),
            (None, PromptTemplates::default())
        );
    }
}
