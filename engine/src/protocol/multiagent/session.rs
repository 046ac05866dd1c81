//! The MultiAgentEval client and session: the action loop of one user step, over HTTP, an
//! agent process or a socket.
//!
//! [`MultiAgentClient`] is an agent as configured for a run: where it lives (`POST {url}`,
//! a process through [`LineTransport`] in either [`ProcessMode`], or a TCP/Unix socket) and
//! the [`MultiAgentOptions`] of the loop. Each conversation is a [`MultiAgentSession`]: the
//! [`Dialogue`] it resends on every request and a per-trajectory [`Sandbox`] that answers the
//! agent's tool calls. Both are owned, so a fork is a clone ([`Session::fork`] is `Some`).
//!
//! **The loop.** A user step sends the task; every reply is an action:
//! - `call_tool` / `call_multiple_tools`: each call runs in the sandbox (the agent's own
//!   `tool_output` stays in the recorded reply but is never used), the results enter the
//!   history and the sandbox's feedback becomes the next `task_description`
//!   ([`Dialogue::continue_with`]);
//! - `processing`: the same request again;
//! - `final_answer`, `completed`, `provide_instructions`: the loop ends, their text is the
//!   turn's reply; `error` ends it too, with an `agent_error` fault carrying its message;
//! - `hitl_pause`: the turn ends with the prompt as its reply and the session waits for a
//!   [`TurnInput::Human`] step, which answers it; anything else while paused is a fault;
//! - `branch`: the turn ends with [`Turn::branch`] set (the alternatives the agent listed,
//!   see [`super::wire::branch_options`]); the executor forks the session once per
//!   alternative and continues each copy with a [`TurnInput::Branch`] turn, which tells the
//!   agent which branch it is on ([`Dialogue::continue_branch`]) and resumes the loop with
//!   the actions it has left;
//! - after [`MultiAgentOptions::max_actions`] replies (every reply counts, `processing`
//!   too, so an agent that never finishes cannot loop forever) without an ending action:
//!   a `protocol` fault "no final answer after N actions".
//!
//! **What the turn records.** Every reply is an `assistant` message whose content is the
//! reply object exactly as received (compact JSON, `tool_output` included), with the calls
//! it asked for as `tool_calls`; every sandbox result is a `tool` message (content: the
//! result object as JSON, `name`: the tool) answering its call id. Tool calls are
//! [`ToolCallRecord`]s whose `result` is the sandbox's result object as JSON; a policy
//! breach is one whose result is `{"status":"policy_violation","violation":…}`
//! ([`is_violation`]), and the session counts them ([`MultiAgentSession::violation_count`],
//! [`Sandbox::violation_count`] through [`Session::sandbox`]). The agent's discovered name
//! ([`super::wire::agent_name`]) is the turn's `model`, carried to later turns once known.
//! What a process agent writes on stderr during the turn is one `log` message, its last
//! [`LOG_KEPT`] bytes.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::Value;

use super::wire::{
    Action, Dialogue, Reply, RequestForm, ToolCall, decode_line_reply, decode_reply,
};
use crate::protocol::{
    AgentProtocol, BranchRequest, CallContext, ChatMessage, Conversation, Exchange, Session,
    ToolCallFunction, Turn, TurnInput,
};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::sandbox::{FeedbackWording, Sandbox, SandboxSpec, ToolOutcome, feedback};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, with_agent_headers,
    with_retries,
};
use crate::transport::line::{
    LineEndpoint, LineLimits, LineTransport, ProcessMode, ProcessSpec, SocketAddressError,
};

/// Replies per user step before the loop gives up: the spec's "max turn limit (default: 5)".
pub const DEFAULT_MAX_ACTIONS: u32 = 5;
/// Bytes of a process agent's stderr kept per turn (the most recent ones).
pub const LOG_KEPT: usize = 16 * 1024;

/// A MultiAgentEval agent could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum MultiAgentError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Socket(#[from] SocketAddressError),
}

/// How the loop talks to the agent and answers it.
#[derive(Clone, Debug)]
pub struct MultiAgentOptions {
    /// The spec's full request, or `task_description` alone as newer harnesses send.
    pub request_form: RequestForm,
    /// The words tool results go back in.
    pub feedback: FeedbackWording,
    /// Replies per user step before the loop ends with a fault (at least 1).
    pub max_actions: u32,
    /// Process agents: long-lived (a line per request) or a process per call.
    pub process_mode: ProcessMode,
    /// Socket agents: keep the connection open between calls (the real harness opens one
    /// per call).
    pub keep_open: bool,
    /// The tools that answer the agent's calls; every trajectory gets its own [`Sandbox`].
    pub sandbox: Arc<SandboxSpec>,
    /// Where `tcp:` connections made again are counted (the run's transport's).
    pub redone: crate::transport::connect::Redone,
    /// Where requests sent again to a restarted process are counted (the run's transport's).
    pub resent: crate::transport::connect::Tally<String>,
}

impl Default for MultiAgentOptions {
    fn default() -> Self {
        MultiAgentOptions {
            request_form: RequestForm::default(),
            feedback: FeedbackWording::default(),
            max_actions: DEFAULT_MAX_ACTIONS,
            process_mode: ProcessMode::default(),
            keep_open: false,
            sandbox: Arc::new(SandboxSpec::default()),
            redone: crate::transport::connect::Redone::default(),
            resent: crate::transport::connect::Tally::default(),
        }
    }
}

/// A client for one MultiAgentEval agent. Cheap to clone: every session holds one.
#[derive(Clone)]
pub struct MultiAgentClient {
    inner: Arc<ClientConfig>,
}

struct ClientConfig {
    wire: Wire,
    retry: RetryPolicy,
    options: MultiAgentOptions,
    /// `POST /execute_task`, `process …`, `tcp:…`: the label of every exchange.
    label: Arc<str>,
}

enum Wire {
    Http {
        url: Url,
        headers: HeaderMap,
        limits: CallLimits,
        transport: HttpTransport,
    },
    Line {
        transport: LineTransport,
        limits: LineLimits,
    },
}

impl MultiAgentClient {
    /// An agent served over HTTP: every request is `POST {url}` (the spec's agents serve
    /// `/execute_task`; the URL is used as given). `headers` override the JSON content type
    /// and accept headers sent by default.
    pub fn http(
        url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
        options: MultiAgentOptions,
    ) -> Result<Self, MultiAgentError> {
        let parsed = agent_url(url)?;
        let mut defaults = HeaderMap::with_capacity(headers.len() + 2);
        defaults.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        defaults.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let headers = with_agent_headers(defaults, &headers).map_err(EndpointError::from)?;
        let label = Arc::from(format!("POST {}", parsed.path()));
        Ok(Self::with_wire(
            Wire::Http {
                url: parsed,
                headers,
                limits,
                transport,
            },
            retry,
            options,
            label,
        ))
    }

    /// An agent process, run by `sh -c command` in `options.process_mode`.
    pub fn process(
        command: &str,
        env: Vec<(String, String)>,
        cwd: Option<std::path::PathBuf>,
        limits: LineLimits,
        retry: RetryPolicy,
        options: MultiAgentOptions,
    ) -> Self {
        let label = Arc::from(match options.process_mode {
            ProcessMode::LongLived => format!("line `{command}`"),
            ProcessMode::PerCall => format!("exec `{command}`"),
        });
        let endpoint = LineEndpoint::Process(ProcessSpec {
            command: command.to_owned(),
            env,
            cwd,
            mode: options.process_mode,
        });
        let transport =
            LineTransport::new(endpoint, limits, false).counting_resent_in(options.resent.clone());
        Self::with_wire(Wire::Line { transport, limits }, retry, options, label)
    }

    /// An agent on a socket: `tcp://host:port`, `tcp:host:port`, `unix:///path` or
    /// `unix:/path`; a connection per call unless `options.keep_open`.
    pub fn socket(
        address: &str,
        limits: LineLimits,
        retry: RetryPolicy,
        options: MultiAgentOptions,
    ) -> Result<Self, MultiAgentError> {
        let endpoint = LineEndpoint::socket(address)?;
        let label = Arc::from(match &endpoint {
            LineEndpoint::Tcp(address) => format!("tcp:{address}"),
            LineEndpoint::Unix(path) => format!("unix:{}", path.display()),
            LineEndpoint::Process(spec) => spec.command.clone(),
        });
        let transport = LineTransport::new(endpoint, limits, options.keep_open)
            .counting_in(options.redone.clone());
        Ok(Self::with_wire(
            Wire::Line { transport, limits },
            retry,
            options,
            label,
        ))
    }

    fn with_wire(
        wire: Wire,
        retry: RetryPolicy,
        mut options: MultiAgentOptions,
        label: Arc<str>,
    ) -> Self {
        options.max_actions = options.max_actions.max(1);
        MultiAgentClient {
            inner: Arc::new(ClientConfig {
                wire,
                retry,
                options,
                label,
            }),
        }
    }

    pub fn options(&self) -> &MultiAgentOptions {
        &self.inner.options
    }

    /// A new conversation, as its concrete type (the executor gets it boxed through
    /// [`AgentProtocol::open`]).
    pub fn session(&self) -> MultiAgentSession {
        self.session_with(self.inner.options.sandbox.clone())
    }

    /// A new conversation whose tool calls `sandbox` answers (a scenario's tools).
    pub fn session_with(&self, sandbox: Arc<SandboxSpec>) -> MultiAgentSession {
        MultiAgentSession {
            client: self.clone(),
            dialogue: Dialogue::new(self.inner.options.request_form),
            sandbox: Sandbox::new(sandbox),
            paused: None,
            branching: None,
            actions_used: 0,
            agent_name: None,
            next_call: 1,
        }
    }

    /// Ends a long-lived process (with its whole tree) or a kept-open socket. Dropping the
    /// client also kills the process, without waiting for it.
    pub async fn close(&self) {
        if let Wire::Line { transport, .. } = &self.inner.wire {
            transport.close().await;
        }
    }

    /// Sends the dialogue's next request (after retries) and decodes the reply. The string
    /// is what a process wrote on stderr meanwhile.
    async fn exchange(
        &self,
        dialogue: &Dialogue,
        ctx: &CallContext<'_>,
    ) -> (Exchange, Result<(Reply, String), Fault>) {
        let mut exchange = Exchange {
            label: self.inner.label.clone(),
            ..Default::default()
        };
        let body = match dialogue.request() {
            Ok(body) => Bytes::from(body),
            Err(fault) => return (exchange, Err(fault)),
        };
        let config = &*self.inner;
        let timeout = match &config.wire {
            Wire::Http { limits, .. } => limits.timeout,
            Wire::Line { limits, .. } => limits.timeout,
        };
        // Time each attempt waited for another call on the same pipe or socket: not the
        // agent's latency, and not spent from the trajectory's time budget.
        let queued = std::sync::Mutex::new(Vec::new());
        let attempted = with_retries(config.retry, timeout, ctx.deadline, |timeout| {
            let body = body.clone();
            let queued = &queued;
            async move {
                match &config.wire {
                    Wire::Http {
                        url,
                        headers,
                        limits,
                        transport,
                    } => {
                        let headers = ctx.headers(headers);
                        let response = transport
                            .post_json(url, &headers, body, limits.max_response_size, timeout)
                            .await?;
                        Ok((decode_reply(&response.body)?, String::new()))
                    }
                    Wire::Line { transport, .. } => {
                        // An error report may come before the real answer on the same pipe.
                        let (waited, answer) = transport
                            .call_decoded(&body, timeout, decode_line_reply, |reply| {
                                matches!(reply.action, Action::Error { .. })
                            })
                            .await;
                        if let Ok(mut queued) = queued.lock() {
                            queued.push(waited);
                        }
                        answer
                    }
                }
            }
        })
        .await;
        exchange.attempts = attempted.attempts;
        let queued = queued.into_inner().unwrap_or_default();
        for (attempt, waited) in exchange.attempts.iter_mut().zip(&queued) {
            attempt.latency = attempt.latency.saturating_sub(*waited);
        }
        exchange.queued = queued.iter().sum();
        (exchange, attempted.result)
    }
}

impl AgentProtocol for MultiAgentClient {
    fn open(&self, conversation: &Conversation<'_>) -> Box<dyn Session> {
        match conversation.sandbox {
            Some(sandbox) => Box::new(self.session_with(sandbox.clone())),
            None => Box::new(self.session()),
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(MultiAgentClient::close(self))
    }
}

/// Whether a recorded tool call was refused by a policy (its result is the harness's
/// `{"status":"policy_violation", …}` object).
pub fn is_violation(record: &ToolCallRecord) -> bool {
    record
        .result
        .as_deref()
        .is_some_and(crate::sandbox::is_violation_result)
}

/// One MultiAgentEval conversation: the dialogue it resends and the trajectory's sandbox.
#[derive(Clone)]
pub struct MultiAgentSession {
    client: MultiAgentClient,
    dialogue: Dialogue,
    sandbox: Sandbox,
    /// The prompt of a `hitl_pause` no human has answered yet.
    paused: Option<String>,
    /// The `branch` action waiting for its continuation.
    branching: Option<BranchRequest>,
    /// Replies received in the current user step (a branch continuation goes on counting).
    actions_used: u32,
    /// The agent's name once a reply said it.
    agent_name: Option<String>,
    /// Numbers the trajectory's tool calls (`mae_1`, `mae_2`, …) so ids are unique in it.
    next_call: u64,
}

impl MultiAgentSession {
    pub fn dialogue(&self) -> &Dialogue {
        &self.dialogue
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Tool calls a policy refused in this trajectory so far.
    pub fn violation_count(&self) -> usize {
        self.sandbox.violation_count()
    }

    /// The prompt of the `hitl_pause` waiting for a human, if any.
    pub fn paused(&self) -> Option<&str> {
        self.paused.as_deref()
    }

    /// Takes one turn (what [`Session::turn`] does, without the box).
    /// Puts the turn's input in the dialogue: a task, a human's answer, a branch
    /// continuation; a fault when the input does not fit where the conversation is.
    fn begin(&mut self, input: TurnInput<'_>) -> Result<(), Fault> {
        if let Some(branching) = self.branching.take() {
            match input {
                TurnInput::Branch {
                    index,
                    count,
                    option,
                } => {
                    self.dialogue.continue_branch(
                        index,
                        count,
                        option,
                        branching.reason.as_deref(),
                    );
                }
                other => {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "the agent asked to branch and a `{}` step came instead of one of \
                             its continuations",
                            other.kind()
                        ),
                    ));
                }
            }
        } else {
            match (input, self.paused.is_some()) {
                (TurnInput::User(text), false) => self.dialogue.begin_user(text),
                (TurnInput::Human { approve, message }, true) => {
                    self.paused = None;
                    self.dialogue.begin_human(human_text(approve, message));
                }
                (TurnInput::User(_), true) => {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "the agent paused for a human (`hitl_pause`: {}) and a user message \
                             came instead; answer it with a `hitl approve|reject` step",
                            self.paused.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                (TurnInput::Human { .. }, false) => {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        "a `hitl` step came but the agent did not pause for a human (no \
                         `hitl_pause` is waiting)",
                    ));
                }
                (TurnInput::Branch { .. }, _) => {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        "a branch continuation came but the agent did not ask to branch",
                    ));
                }
                (TurnInput::Opening | TurnInput::Call { .. }, _) => {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "a MultiAgentEval agent cannot take a `{}` step: it is given a task \
                             (a user message) and answers it",
                            input.kind()
                        ),
                    ));
                }
            }
            self.actions_used = 0;
        }
        Ok(())
    }

    pub async fn take_turn(&mut self, input: TurnInput<'_>, ctx: &CallContext<'_>) -> Turn {
        if let Err(fault) = self.begin(input) {
            return Turn::failed(fault);
        }
        let mut turn = Turn {
            model: self.agent_name.clone(),
            ..Default::default()
        };
        let mut log = String::new();
        self.run_loop(&mut turn, &mut log, ctx).await;
        if !log.is_empty() {
            turn.messages.push(ChatMessage {
                role: "log".into(),
                content: Some(log),
                ..Default::default()
            });
        }
        turn
    }

    async fn run_loop(&mut self, turn: &mut Turn, log: &mut String, ctx: &CallContext<'_>) {
        let max_actions = self.client.inner.options.max_actions;
        while self.actions_used < max_actions {
            self.actions_used += 1;
            // Time spent waiting for the agent's pipe or socket is not the trajectory's:
            // its deadline moves by it.
            let ctx = CallContext {
                deadline: ctx.deadline.map(|d| d + turn.queued()),
                ..ctx.clone()
            };
            let (exchange, result) = self.client.exchange(&self.dialogue, &ctx).await;
            turn.exchanges.push(exchange);
            let reply = match result {
                Ok((reply, stderr)) => {
                    append_bounded(log, &stderr);
                    reply
                }
                Err(fault) => {
                    turn.fault = Some(fault);
                    return;
                }
            };
            if self.handle_reply(reply, turn) {
                return;
            }
        }
        turn.fault = Some(Fault::new(
            FaultCategory::Protocol,
            format!(
                "no final answer after {max_actions} action{} (the loop's limit): the agent \
                 never answered `final_answer`, `completed`, `provide_instructions` or `error`",
                if max_actions == 1 { "" } else { "s" }
            ),
        ));
    }

    /// Acts on one reply of the agent: runs its tool calls, or ends the step. Returns
    /// whether the step is over. Shared by the loop and by [`Session::restore`], which
    /// feeds it recorded replies: the sandbox runs the same calls again, so its state,
    /// sequence positions and records come out as they were.
    fn handle_reply(&mut self, reply: Reply, turn: &mut Turn) -> bool {
        if let Some(name) = &reply.agent_name {
            self.agent_name = Some(name.clone());
            turn.model = Some(name.clone());
        }
        self.dialogue.record_reply(&reply);
        // The reply as received is the turn's data, for `reply json-path=…`: the turn's
        // reply text is one of its fields, and a check may ask for another (the summary
        // beside the instructions). The last reply of the turn is the one kept.
        let data = Value::Object(reply.raw.clone());
        let raw = data.to_string();
        turn.data = Some(data);
        let summary = reply.summary().map(str::to_owned);
        match reply.action {
            Action::CallTool(call) => self.run_calls(turn, raw, vec![call]),
            Action::CallMultipleTools(calls) => self.run_calls(turn, raw, calls),
            Action::Processing => {
                turn.messages.push(ChatMessage::assistant(raw));
                self.dialogue.resend();
            }
            Action::HitlPause { prompt } => {
                turn.messages.push(ChatMessage::assistant(raw));
                let prompt = prompt.unwrap_or_default();
                turn.reply = Some(prompt.clone());
                self.paused = Some(prompt);
                return true;
            }
            Action::Branch {
                reason, options, ..
            } => {
                turn.messages.push(ChatMessage::assistant(raw));
                turn.reply = reason.clone().or(summary);
                let request = BranchRequest { reason, options };
                turn.branch = Some(request.clone());
                self.branching = Some(request);
                return true;
            }
            Action::Error { message } => {
                turn.messages.push(ChatMessage::assistant(raw));
                let message = message.or(summary);
                turn.reply = message.clone();
                turn.fault = Some(Fault::new(
                    FaultCategory::AgentError,
                    match message {
                        Some(message) => format!("the agent answered `error`: {message}"),
                        None => "the agent answered `error` without a message".to_owned(),
                    },
                ));
                return true;
            }
            ending @ (Action::FinalAnswer { .. }
            | Action::Completed { .. }
            | Action::ProvideInstructions { .. }) => {
                turn.messages.push(ChatMessage::assistant(raw));
                turn.reply = ending
                    .final_text()
                    .map(str::to_owned)
                    .or(summary)
                    .or(Some(String::new()));
                return true;
            }
        }
        false
    }

    /// Replays recorded turns into this session without calling the agent: each input
    /// goes into the dialogue and each recorded reply (the `assistant` messages, the reply
    /// objects as received) is acted on again. `false`, with nothing changed, when a
    /// recorded turn does not fit (an input the conversation could not take, a reply that
    /// no longer decodes).
    fn replay(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let mut copy = self.clone();
        for (input, recorded) in history {
            if copy.begin(*input).is_err() {
                return false;
            }
            let mut scratch = Turn::default();
            for message in recorded.messages.iter().filter(|m| m.role == "assistant") {
                let Ok(reply) = decode_reply(message.content.as_deref().unwrap_or("").as_bytes())
                else {
                    return false;
                };
                copy.actions_used = copy.actions_used.saturating_add(1);
                if copy.handle_reply(reply, &mut scratch) {
                    break;
                }
            }
        }
        *self = copy;
        true
    }

    /// Runs the calls of one reply in the sandbox, records them and feeds the results back.
    fn run_calls(&mut self, turn: &mut Turn, raw: String, calls: Vec<ToolCall>) {
        let mut message = ChatMessage::assistant(raw);
        let mut outcomes: Vec<(String, ToolOutcome)> = Vec::with_capacity(calls.len());
        let mut results = Vec::with_capacity(calls.len());
        let mut answers = Vec::with_capacity(calls.len());
        for call in calls {
            let id = format!("mae_{}", self.next_call);
            self.next_call = self.next_call.saturating_add(1);
            let arguments = Value::Object(call.params.clone()).to_string();
            let outcome = self.sandbox.call(&call.name, &Value::Object(call.params));
            let result = outcome.result_object();
            // Recorded as the agent is sent it (`Tool 'NAME' returned: {…}`): the harness's
            // `json.dumps`, `status` first, not serde's sorted and compact text.
            let result_text = crate::sandbox::python_json_dumps(&result);
            message.tool_calls.push(crate::protocol::ToolCall {
                id: id.clone(),
                kind: "function".into(),
                function: ToolCallFunction {
                    name: call.name.clone(),
                    arguments: arguments.clone(),
                },
            });
            turn.tool_calls.push(ToolCallRecord {
                call_id: id.clone(),
                name: call.name.clone(),
                arguments,
                result: Some(result_text.clone()),
            });
            answers.push(ChatMessage {
                role: "tool".into(),
                content: Some(result_text),
                tool_call_id: Some(id),
                name: Some(call.name.clone()),
                ..Default::default()
            });
            results.push(result);
            outcomes.push((call.name, outcome));
        }
        let named: Vec<(&str, &ToolOutcome)> = outcomes
            .iter()
            .map(|(name, outcome)| (name.as_str(), outcome))
            .collect();
        let text = feedback(self.client.inner.options.feedback, &named);
        turn.messages.push(message);
        turn.messages.extend(answers);
        self.dialogue.continue_with(results, text);
    }
}

impl Session for MultiAgentSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(self.take_turn(input, ctx))
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(self.clone()))
    }

    fn sandbox(&self) -> Option<&Sandbox> {
        Some(&self.sandbox)
    }

    fn paused(&self) -> Option<&str> {
        self.paused.as_deref()
    }

    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        self.replay(history)
    }
}

/// The `task_description` (and human history entry) of a human's answer to a pause:
/// `Approved` or `Rejected`, then `: MESSAGE` when the step gave one.
fn human_text(approve: bool, message: Option<&str>) -> String {
    let verdict = if approve { "Approved" } else { "Rejected" };
    match message.map(str::trim).filter(|m| !m.is_empty()) {
        Some(message) => format!("{verdict}: {message}"),
        None => verdict.to_owned(),
    }
}

/// Appends `more` to `log`, keeping only the last [`LOG_KEPT`] bytes (cut at a character
/// boundary, marked by a leading `…`).
fn append_bounded(log: &mut String, more: &str) {
    if more.is_empty() {
        return;
    }
    log.push_str(more);
    if log.len() > LOG_KEPT {
        let mut cut = log.len() - LOG_KEPT;
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        let kept = log.split_off(cut);
        *log = format!("…{kept}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_answers_are_worded_with_their_verdict() {
        assert_eq!(human_text(true, Some(" go ahead ")), "Approved: go ahead");
        assert_eq!(human_text(false, None), "Rejected");
        assert_eq!(human_text(false, Some("")), "Rejected");
    }

    #[test]
    fn the_log_keeps_its_tail() {
        let mut log = String::new();
        append_bounded(&mut log, &"é".repeat(LOG_KEPT));
        append_bounded(&mut log, "the end\n");
        assert!(log.len() <= LOG_KEPT + "…".len() + 1, "{}", log.len());
        assert!(log.starts_with('…') && log.ends_with("the end\n"));
    }

    #[test]
    fn violations_are_recognised_by_their_result() {
        let record = |result: &str| ToolCallRecord {
            call_id: "mae_1".into(),
            name: "apply_refund".into(),
            arguments: "{}".into(),
            result: Some(result.into()),
        };
        assert!(is_violation(&record(
            r#"{"status":"policy_violation","violation":"Amount 100 exceeds limit of 50.0"}"#
        )));
        assert!(!is_violation(&record(r#"{"status":"success"}"#)));
        assert!(!is_violation(&record("not json")));
    }
}
