//! The LLM side of a run: the suite's providers as clients, its judges resolved, the response
//! cache, and judging one criterion into its record.
//!
//! Which judge scores a criterion: the one it names (`judge="ID"`), else the first `judge`
//! node of the project, else an implicit judge on the project's only `provider` (its model).
//! Without any, `judge`/`outcome` criteria are skipped with a reason that says how to
//! configure one. The rubric: the criterion's `rubric=`, else the scenario's
//! `criteria-override`, else the judge's `rubric`, else `generic`; outcomes are always judged
//! as holds / does not hold. The pass mark: the criterion's `threshold`, else the judge's,
//! else the rubric's default (Connexity 0.75, outcomes 1, others 0.5).

use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;
use trellis_dsl::{
    Consensus, CriterionKind, Judge, Outcome, Panel, Persona, PersonaRef, Project, Provider,
    Scenario, Simulator,
};

use super::judge::{self, JudgeContext, JudgeVerdict, PersonaInfo, Question, Rubric};
use super::meter::{LlmMeter, Role};
use super::simulator::{self, Character, Layered, SIMULATOR_RETRIES, Said};
use super::{LlmCache, LlmCall, ProviderClient};
use crate::record::{CriterionRecord, CriterionStatus, Fault, FaultCategory, TurnRecord};
use crate::render::EnvSnapshot;
use crate::transport::http::HttpTransport;

/// The project's LLM configuration, carried by the plan.
#[derive(Clone, Debug, Default)]
pub struct LlmSetup {
    pub providers: Vec<Provider>,
    pub judges: Vec<Judge>,
    pub panels: Vec<Panel>,
    pub simulator: Option<Simulator>,
    pub personas: Vec<Persona>,
}

impl LlmSetup {
    pub fn from_project(project: &Project) -> Self {
        LlmSetup {
            providers: project.providers.clone(),
            judges: project.judges.clone(),
            panels: project.panels.clone(),
            simulator: project.simulator.clone(),
            personas: project.personas.clone(),
        }
    }

    /// Whether `simulate` steps can run: a `simulator` node, or a lone provider.
    pub fn has_simulator(&self) -> bool {
        self.simulator.is_some() || self.providers.len() == 1
    }

    /// Whether any judge can be resolved at all (a `judge` node or a lone provider).
    pub fn has_judge(&self) -> bool {
        !self.judges.is_empty() || self.providers.len() == 1
    }
}

/// Why `judge`/`outcome` criteria are skipped when the suite configures no judge.
pub const NO_JUDGE: &str = "no judge configured: add a `provider` and a `judge \"ID\" \
                            provider=\"…\"` node (a lone `provider` is used as the judge)";

/// `JudgeVerdict::error_category` of a judge whose answer does not parse.
const UNUSABLE_ANSWER: &str = "unusable_answer";
/// `JudgeVerdict::error_category` of a judge the run could not call (its provider failed to
/// set up, or a panel member that is not configured).
const SETUP: &str = "setup";

/// A judge ready to call.
struct Resolved<'a> {
    name: String,
    client: &'a ProviderClient,
    model: Option<&'a str>,
    temperature: Option<f64>,
    rubric: Option<&'a str>,
    threshold: Option<f64>,
}

/// A judge that cannot be asked (its provider has no key, or no such judge), with what is
/// known of it: a check it leaves unjudged still records which judge, rubric and threshold
/// it was to be judged by.
struct Unresolved<'a> {
    name: String,
    rubric: Option<&'a str>,
    threshold: Option<f64>,
    reason: String,
}

impl std::fmt::Display for Unresolved<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// One criterion to judge, with where it sits.
pub struct JudgeTask<'a, T> {
    pub criterion_text: &'a str,
    pub kind: &'a CriterionKind,
    pub scenario: &'a Scenario,
    pub turns: &'a [T],
    /// Set for turn-level (`expect`) criteria.
    pub turn_index: Option<u32>,
    pub repetition: u32,
    /// Which judgment of the same transcript this is (`trellis variance` judges each one
    /// several times): part of the cache key when not 0, so every draw is a real one.
    pub draw: u32,
    /// Names the call in a replay-only cache miss.
    pub call_name: String,
    /// The scenario's `expect-tool` calls as the judge is shown them, their templated
    /// parameters rendered where it is asked ([`crate::render::expected_tools_rendered`]).
    pub expected_tools: Vec<(String, Map<String, Value>)>,
}

/// The providers, judges and cache of a run.
pub struct LlmRuntime {
    setup: LlmSetup,
    clients: HashMap<String, Result<Arc<ProviderClient>, String>>,
    /// The model servers of the run and their slots (llama.cpp), shared by providers and
    /// model agents on one server.
    servers: super::slots::ServerRegistry,
    transport: HttpTransport,
    cache: LlmCache,
    meter: LlmMeter,
}

impl std::fmt::Debug for LlmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmRuntime")
            .field("providers", &self.clients.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl LlmRuntime {
    /// Builds a client per provider (a provider that cannot be used, such as one whose key
    /// is not set, fails only the criteria that use it).
    pub fn new(
        setup: LlmSetup,
        env: &EnvSnapshot,
        transport: &HttpTransport,
        cache: LlmCache,
    ) -> Arc<Self> {
        let servers = super::slots::ServerRegistry::default();
        let clients = setup
            .providers
            .iter()
            .map(|p| {
                (
                    p.id.value.clone(),
                    // Asking a model again has no side effect.
                    ProviderClient::new(p, env, transport.clone().replaying_lost(true), &servers)
                        .map(Arc::new)
                        .map_err(|e| e.to_string()),
                )
            })
            .collect();
        Arc::new(LlmRuntime {
            setup,
            clients,
            servers,
            transport: transport.clone().replaying_lost(true),
            cache,
            meter: LlmMeter::default(),
        })
    }

    pub fn setup(&self) -> &LlmSetup {
        &self.setup
    }

    /// The slots of the model server behind `url` (a model agent's own `base-url`), shared
    /// with the providers on the same server; `None` for `https://` URLs.
    pub fn server_slots(
        &self,
        url: &reqwest::Url,
        headers: &reqwest::header::HeaderMap,
    ) -> Option<Arc<super::slots::ServerSlots>> {
        self.servers.for_url(url, headers, &self.transport)
    }

    /// The client of provider `id`, shared by everything of the run that uses it (its limits
    /// count every call); `Err` says why it cannot be used.
    pub fn client(&self, id: &str) -> Result<Arc<ProviderClient>, String> {
        match self.clients.get(id) {
            Some(Ok(client)) => Ok(client.clone()),
            // The setup error names the provider already.
            Some(Err(e)) => Err(e.clone()),
            None => Err(format!("provider `{id}` is not defined")),
        }
    }

    /// Whether `kind` is judged by an LLM.
    pub fn is_judged(kind: &CriterionKind) -> bool {
        matches!(
            kind,
            CriterionKind::Judge { .. } | CriterionKind::Outcome(_)
        )
    }

    fn resolve(&self, named: Option<&str>) -> Option<Result<Resolved<'_>, Unresolved<'_>>> {
        let judge = match named {
            Some(id) => self.setup.judges.iter().find(|j| j.id.value == id),
            None => self.setup.judges.first(),
        };
        let (name, provider_id, model, temperature, rubric, threshold) = match judge {
            Some(j) => (
                j.id.value.clone(),
                j.provider.value.as_str(),
                j.model.as_deref(),
                j.temperature,
                j.rubric.as_deref(),
                j.threshold,
            ),
            None if named.is_some() => {
                let name = named.unwrap_or("").to_owned();
                return Some(Err(Unresolved {
                    reason: format!("judge `{name}` is not defined"),
                    name,
                    rubric: None,
                    threshold: None,
                }));
            }
            None => match self.setup.providers.as_slice() {
                [only] => (
                    format!("provider:{}", only.id.value),
                    only.id.value.as_str(),
                    None,
                    Some(0.0),
                    None,
                    None,
                ),
                _ => return None,
            },
        };
        Some(match self.clients.get(provider_id) {
            Some(Ok(client)) => Ok(Resolved {
                name,
                client,
                model,
                temperature,
                rubric,
                threshold,
            }),
            Some(Err(e)) => Err(Unresolved {
                name,
                rubric,
                threshold,
                reason: e.clone(),
            }),
            None => Err(Unresolved {
                name,
                rubric,
                threshold,
                reason: format!("provider `{provider_id}` is not defined"),
            }),
        })
    }

    /// Whether a check of `kind` would ask a judge at all: `false` for a judged check with
    /// no judge configured (it is skipped as [`NO_JUDGE`] at once, with no call to abandon)
    /// and for a check that is not LLM-judged.
    pub fn would_ask_a_judge(&self, kind: &CriterionKind) -> bool {
        let named = match kind {
            CriterionKind::Judge { judge, .. } => judge.as_ref().map(|j| j.value.as_str()),
            CriterionKind::Outcome(_) => None,
            _ => return false,
        };
        named.is_some_and(|id| self.setup.panels.iter().any(|p| p.id.value == id))
            || self.resolve(named).is_some()
    }

    /// Judges one `judge`/`outcome` criterion (or a scenario-level outcome) into its record:
    /// passed or failed on the judge's score, `skipped` without a judge, `error` when the
    /// judge failed or answered garbage. A criterion naming a panel is judged by each of its
    /// judges at once and decided by the panel's consensus rule.
    pub async fn judge<T: AsRef<TurnRecord>>(&self, task: JudgeTask<'_, T>) -> CriterionRecord {
        let mut record = CriterionRecord {
            turn_index: task.turn_index,
            criterion: task.criterion_text.to_owned(),
            kind: task.kind.name().to_owned(),
            status: CriterionStatus::Skipped,
            detail: None,
            judge: None,
        };
        let (question_text, named, criterion_rubric, criterion_threshold) = match task.kind {
            CriterionKind::Judge {
                criterion,
                threshold,
                judge,
                rubric,
            } => (
                criterion.clone(),
                judge.as_ref().map(|j| j.value.as_str()),
                rubric.as_deref(),
                *threshold,
            ),
            CriterionKind::Outcome(outcome) => (outcome_statement(outcome), None, None, None),
            _ => {
                record.detail = Some("not an LLM-judged criterion".into());
                return record;
            }
        };
        let question = QuestionSpec {
            text: &question_text,
            rubric: criterion_rubric,
            threshold: criterion_threshold,
        };
        if let Some(panel) =
            named.and_then(|id| self.setup.panels.iter().find(|p| p.id.value == id))
        {
            let members = futures::future::join_all(
                panel
                    .judges
                    .iter()
                    .map(|member| self.judge_one(Some(&member.value), &question, &task)),
            )
            .await;
            let (status, detail, verdict) = decide(panel, members);
            record.status = status;
            record.detail = Some(detail);
            record.judge = Some(Box::new(verdict));
            return record;
        }
        let (status, detail, verdict) = self.judge_one(named, &question, &task).await;
        record.status = status;
        record.detail = Some(detail);
        record.judge = verdict.map(Box::new);
        record
    }

    /// One judge's verdict on `question`: the status, the detail, and the verdict record
    /// (none when no judge is configured at all).
    async fn judge_one<T: AsRef<TurnRecord>>(
        &self,
        named: Option<&str>,
        question: &QuestionSpec<'_>,
        task: &JudgeTask<'_, T>,
    ) -> (CriterionStatus, String, Option<JudgeVerdict>) {
        // The rubric and threshold the check is judged by: its own, else the scenario's
        // override (the rubric), else the judge's, else the rubric's default threshold.
        let judged_by = |judge_rubric: Option<&str>, judge_threshold: Option<f64>| {
            let rubric = match task.kind {
                CriterionKind::Outcome(_) => Rubric::Outcome,
                _ => Rubric::from_setting(
                    question
                        .rubric
                        .or(task
                            .scenario
                            .criteria_override
                            .as_ref()
                            .map(|s| s.value.as_str()))
                        .or(judge_rubric),
                ),
            };
            let threshold = question
                .threshold
                .or(judge_threshold)
                .unwrap_or_else(|| rubric.default_threshold());
            (rubric, threshold)
        };
        let resolved = match self.resolve(named) {
            None => return (CriterionStatus::Skipped, NO_JUDGE.to_owned(), None),
            Some(Err(e)) => {
                let (rubric, threshold) = judged_by(e.rubric, e.threshold);
                let verdict = JudgeVerdict {
                    judge: e.name.clone(),
                    rubric: rubric.name().to_owned(),
                    threshold,
                    error_category: Some(SETUP.to_owned()),
                    ..JudgeVerdict::default()
                };
                return (
                    CriterionStatus::Error,
                    format!("judge unavailable: {e}"),
                    Some(verdict),
                );
            }
            Some(Ok(r)) => r,
        };
        let (rubric, threshold) = judged_by(resolved.rubric, resolved.threshold);
        let ctx = self.context(task.scenario, task.expected_tools.clone());
        let asked = Question {
            criterion: question.text,
            rubric: &rubric,
            turn: task.turn_index,
        };
        let mut request = judge::request(&ctx, &asked, task.turns);
        request.max_tokens_default = Some(super::JUDGE_MAX_TOKENS);
        request.temperature_default = Some(0.0);
        request.model = resolved.model.map(str::to_owned);
        request.temperature = resolved.temperature;
        request.attempt = task.draw;
        if resolved.client.kind() == trellis_dsl::ProviderKind::Anthropic {
            // No structured output there: the prompt asks for JSON and parsing is strict.
            request.json_schema = None;
        }
        let mut outcome = self
            .complete_as(
                Role::Judge,
                resolved.client,
                &request,
                task.repetition,
                &task.call_name,
                None::<Instant>,
            )
            .await;
        // A server without structured output refuses the request (4xx), and llama.cpp
        // answers 500 for a schema its grammar converter does not take: ask again without
        // it; the prompt already asks for JSON and parsing is strict.
        let mut asked_twice = false;
        // Not for an answer that says who may call or where (401, 403, 404): asking without
        // the schema would only fail the same way, twice the calls.
        if request.json_schema.is_some()
            && matches!(
                &outcome.result,
                Err(super::LlmError::Http {
                    category: FaultCategory::Http4xx | FaultCategory::Http5xx,
                    message,
                    ..
                }) if !["HTTP 401", "HTTP 403", "HTTP 404"].iter().any(|s| message.starts_with(s))
            )
        {
            request.json_schema = None;
            asked_twice = true;
            let first = outcome.call;
            outcome = self
                .complete_as(
                    Role::Judge,
                    resolved.client,
                    &request,
                    task.repetition,
                    &task.call_name,
                    None::<Instant>,
                )
                .await;
            // One check's call of two asks: its requests are both asks' (as the run's meter
            // counted them).
            outcome.call.attempts = outcome.call.attempts.saturating_add(first.attempts);
            outcome.call.latency_ms += first.latency_ms;
            outcome.call.waited_ms += first.waited_ms;
        }
        let mut verdict = JudgeVerdict {
            judge: resolved.name,
            rubric: rubric.name().to_owned(),
            threshold,
            call: outcome.call,
            ..JudgeVerdict::default()
        };
        let completion = match outcome.result {
            // Not sent: the run is stopping at its LLM budget, as after a signal. The call
            // is marked refused (`LlmCall::refused`): no call in the trajectory's counts.
            Err(super::LlmError::Budget(reason)) => {
                verdict.error_category = Some("budget".to_owned());
                return (
                    CriterionStatus::Skipped,
                    format!("not checked: {reason}"),
                    Some(verdict),
                );
            }
            // The record's attempts add up both calls; the error is the second's.
            Err(e) if asked_twice => {
                verdict.error_category = Some(e.category().to_owned());
                return (
                    CriterionStatus::Error,
                    format!(
                        "the judge call failed with its JSON schema and again without it \
                         ({} attempts in all): {e}",
                        verdict.call.attempts
                    ),
                    Some(verdict),
                );
            }
            Err(e) => {
                verdict.error_category = Some(e.category().to_owned());
                return (
                    CriterionStatus::Error,
                    format!("the judge call failed: {e}"),
                    Some(verdict),
                );
            }
            Ok(completion) => completion,
        };
        // The answer, with the score's verdict said against the threshold; an answer whose
        // words contradict its score is as unusable as one that does not parse.
        let judged = judge::parse_answer(&rubric, &completion.text).and_then(|answer| {
            let passed = answer.score >= threshold;
            let (shown, against) = score_and_threshold(answer.score, threshold);
            let said = format!("{shown} {} {against}", if passed { ">=" } else { "<" });
            match answer
                .stated
                .as_ref()
                .and_then(|s| s.contradicts(answer.score, passed, &said, &completion.text))
            {
                Some(garbage) => Err(garbage),
                None => Ok((answer, passed, said)),
            }
        });
        match judged {
            Err(garbage) => {
                // Not kept: replayed, the same unusable answer would be every later run's.
                self.cache
                    .forget(resolved.client, &request, task.repetition)
                    .await;
                verdict.error_category = Some(UNUSABLE_ANSWER.to_owned());
                // An answer cut at the token limit reads as garbage; said, the fix is plain.
                let cut = if super::codec::cut_at_token_limit(completion.finish_reason.as_deref()) {
                    " (the answer was cut off at its token limit: raise its provider's \
                     `max-tokens`)"
                } else {
                    ""
                };
                (
                    CriterionStatus::Error,
                    format!("{garbage}{cut}"),
                    Some(verdict),
                )
            }
            Ok((answer, passed, said)) => {
                let detail = format!(
                    "score {said}{}",
                    answer
                        .justification
                        .as_deref()
                        .map(|j| format!(": {j}"))
                        .unwrap_or_default()
                );
                verdict.score = Some(answer.score);
                verdict.label = answer.label;
                verdict.justification = answer.justification;
                verdict.metrics = answer.metrics;
                let status = if passed {
                    CriterionStatus::Passed
                } else {
                    CriterionStatus::Failed
                };
                (status, detail, Some(verdict))
            }
        }
    }

    /// A persona reference as the persona it names (`trellis check` made sure it exists).
    fn resolve_persona<'a>(&'a self, persona: &'a PersonaRef) -> Option<&'a Persona> {
        match persona {
            PersonaRef::Named(id) => self.setup.personas.iter().find(|p| p.id.value == id.value),
            PersonaRef::Inline(p) => Some(&**p),
        }
    }

    fn context<'a>(
        &'a self,
        scenario: &'a Scenario,
        expected_tools: Vec<(String, Map<String, Value>)>,
    ) -> JudgeContext<'a> {
        let persona = scenario
            .persona
            .as_ref()
            .and_then(|p| self.resolve_persona(p));
        JudgeContext {
            scenario: &scenario.id.value,
            description: scenario.description.as_deref(),
            persona: persona.map(|p| PersonaInfo {
                kind: p.kind.clone(),
                description: p.description.clone(),
                instructions: p.instructions.clone(),
            }),
            user_context: Some(&scenario.user_context),
            expected_tools,
            no_tools: scenario
                .criteria
                .iter()
                .any(|c| matches!(c.kind, CriterionKind::NoTool { name: None })),
            // A statement still written as a template reads captures: it is rendered only
            // where it is asked itself, and left out of the others' context.
            outcomes: scenario
                .outcomes
                .iter()
                .map(|o| outcome_statement(&o.value))
                .filter(|o| !trellis_dsl::template::is_template(o))
                .collect(),
            history: scenario
                .history
                .as_ref()
                .and_then(|h| h.messages.as_deref())
                .map_or(&[], Vec::as_slice),
        }
    }
}

/// A score and its threshold as a detail shows them: two decimals, or as many more as it
/// takes for the two to read as different when they are (0.699 against 0.7 is not
/// "0.70 < 0.70").
fn score_and_threshold(score: f64, threshold: f64) -> (String, String) {
    for digits in 2..=6 {
        let (a, b) = (format!("{score:.digits$}"), format!("{threshold:.digits$}"));
        if a != b || score == threshold {
            return (a, b);
        }
    }
    (score.to_string(), threshold.to_string())
}

/// One `simulate` turn to write.
pub struct SimulateTask<'a, T> {
    pub scenario: &'a Scenario,
    pub turns: &'a [T],
    pub repetition: u32,
    /// The scenario's or branch's `simulator`, in place of the project's.
    pub simulator: Option<&'a Simulator>,
    /// The branch's `persona`, played in place of the scenario's.
    pub persona: Option<&'a PersonaRef>,
    /// The plan's templates, which render the simulator's prompts.
    pub templates: &'a crate::render::Templates,
    /// The scenario's template scope and the captures on this path so far.
    pub scope: &'a crate::render::ScenarioScope,
    pub vars: &'a std::collections::BTreeMap<String, String>,
    /// Names the call in a replay-only cache miss.
    pub call_name: String,
    /// The attempt at the trajectory (`retries-invalid`), part of the cache key.
    pub attempt: u32,
    /// What remains of the trajectory's `timeout`: the simulated user's calls count in it.
    pub deadline: Option<Instant>,
}

/// What the simulated user said, and the LLM calls it took (retries included).
#[derive(Clone, Debug)]
pub struct Simulated {
    /// [`Said::Unusable`] only when the fidelity guards are on and every retry was
    /// unusable (otherwise that is a `simulator` fault).
    pub said: Said,
    pub calls: Vec<LlmCall>,
    /// Who the user is ([`Character::brief`]), for the fidelity judge.
    pub brief: String,
    /// The layered `fidelity` setting of this step.
    pub fidelity: Option<bool>,
    /// Why the answer was unusable ([`Said::Unusable`]).
    pub note: Option<String>,
}

impl LlmRuntime {
    /// Writes the simulated user's next message. `Err` is the `simulator` fault that ends the
    /// trajectory (no simulator, a failed call, unusable answers after the retries), with the
    /// calls made.
    pub async fn simulate<T: AsRef<TurnRecord>>(
        &self,
        task: SimulateTask<'_, T>,
    ) -> Result<Simulated, (Fault, Vec<LlmCall>)> {
        let fault = |message: String| Fault::new(FaultCategory::Simulator, message);
        let layered = Layered::new(task.simulator, self.setup.simulator.as_ref());
        let (model, temperature) = (layered.model, layered.temperature);
        let provider_id = match (layered.provider, self.setup.providers.as_slice()) {
            (Some(id), _) => id,
            (None, [only]) => only.id.value.as_str(),
            (None, _) => {
                return Err((
                    fault("no simulator configured: add `simulator provider=\"ID\"`".into()),
                    Vec::new(),
                ));
            }
        };
        let client = match self.clients.get(provider_id) {
            Some(Ok(client)) => client,
            Some(Err(e)) => return Err((fault(format!("simulator unavailable: {e}")), Vec::new())),
            None => {
                return Err((
                    fault(format!("simulator provider `{provider_id}` is not defined")),
                    Vec::new(),
                ));
            }
        };
        let instructions =
            simulator::instructions(task.templates, &layered.instructions, task.scope, task.vars)
                .map_err(|e| (fault(e.to_string()), Vec::new()))?;
        let character = self
            .character(&task, instructions)
            .map_err(|e| (fault(e.to_string()), Vec::new()))?;
        let mut calls = Vec::new();
        let mut last_answer = String::new();
        // Whether the last answer was cut at the token limit (said in the fault).
        let mut last_cut = false;
        for retry in 0..=SIMULATOR_RETRIES {
            let mut request = match simulator::request(
                task.templates,
                &layered.prompts,
                &character,
                task.turns,
                retry,
            ) {
                Ok(request) => request,
                Err(e) => return Err((fault(e.to_string()), calls)),
            };
            request.max_tokens_default = Some(super::SIMULATOR_MAX_TOKENS);
            request.model = model.map(str::to_owned);
            request.temperature = temperature;
            request.attempt = task.attempt;
            let outcome = self
                .complete_as(
                    Role::Simulator,
                    client,
                    &request,
                    task.repetition,
                    &task.call_name,
                    task.deadline,
                )
                .await;
            calls.push(outcome.call);
            let text = match outcome.result {
                // Cut at the token limit: a message broken off mid-word is no user's turn,
                // and is asked again like an unusable answer (as a model agent's is a fault).
                Ok(c) if super::codec::cut_at_token_limit(c.finish_reason.as_deref()) => {
                    last_answer = c.text;
                    last_cut = true;
                    continue;
                }
                Ok(c) => c.text,
                // An empty completion is an unusable answer, asked again like one.
                Err(super::LlmError::Malformed { detail, .. }) if detail.contains("no text") => {
                    String::new()
                }
                Err(e) => return Err((fault(format!("the simulator call failed: {e}")), calls)),
            };
            last_cut = false;
            match simulator::interpret(&text) {
                Said::Unusable => last_answer = text,
                said => {
                    return Ok(Simulated {
                        said,
                        calls,
                        brief: character.brief(),
                        fidelity: layered.fidelity,
                        note: None,
                    });
                }
            }
        }
        let mut shown: String = last_answer.trim().chars().take(160).collect();
        if shown.is_empty() {
            shown = "(empty)".into();
        }
        let why = format!(
            "the simulator gave no usable message in {} attempts; last answer{}: {shown:?}",
            SIMULATOR_RETRIES + 1,
            if last_cut {
                " (cut at its token limit)"
            } else {
                ""
            }
        );
        // With the guards on, an empty or role-only answer is the simulator breaking
        // character (the trajectory is `invalid`), not a fault of the run.
        if layered.fidelity != Some(false) {
            return Ok(Simulated {
                said: Said::Unusable,
                calls,
                brief: character.brief(),
                fidelity: layered.fidelity,
                note: Some(why),
            });
        }
        Err((fault(why), calls))
    }

    /// Who the simulated user of `task` is ([`Character::brief`]) and the step's layered
    /// `fidelity` setting, without calling the simulator: what a replayed user message
    /// (`--replay-users`) hands the fidelity judge, as a written one would.
    pub fn simulated_brief<T: AsRef<TurnRecord>>(
        &self,
        task: &SimulateTask<'_, T>,
    ) -> (String, Option<bool>) {
        let layered = Layered::new(task.simulator, self.setup.simulator.as_ref());
        // A template that does not render failed the recorded run's simulator already;
        // the brief goes without it rather than failing a replay.
        let instructions =
            simulator::instructions(task.templates, &layered.instructions, task.scope, task.vars)
                .ok()
                .flatten();
        let brief = self.character(task, instructions).map_or_else(
            |e| format!("(the persona could not be filled in: {e})"),
            |c| c.brief(),
        );
        (brief, layered.fidelity)
    }

    /// The simulated user of `task`: the persona it plays (its own, else the scenario's),
    /// the scenario's context and the simulator's rendered `instructions`.
    fn character<'a, T>(
        &'a self,
        task: &SimulateTask<'a, T>,
        instructions: Option<String>,
    ) -> Result<Character<'a>, simulator::PromptError> {
        let ctx = self.context(task.scenario, Vec::new());
        let persona = match task.persona {
            // A branch's persona is filled in where it is played, in the trajectory's scope
            // (the scenario's was, when the run was planned).
            Some(playing) => match self.resolve_persona(playing) {
                Some(p) => {
                    let render = |prompt: &'static str, text: &Option<String>| match text {
                        Some(text) if trellis_dsl::template::is_template(text) => task
                            .templates
                            .render_source(text, || task.scope.with_vars(task.vars))
                            .map(Some)
                            .map_err(|error| simulator::PromptError { prompt, error }),
                        _ => Ok(text.clone()),
                    };
                    Some(PersonaInfo {
                        kind: p.kind.clone(),
                        description: render("persona's description", &p.description)?,
                        instructions: render("persona's instructions", &p.instructions)?,
                    })
                }
                None => None,
            },
            None => ctx.persona,
        };
        Ok(Character {
            persona,
            user_context: ctx.user_context,
            description: ctx.description,
            instructions,
            scope: Some((task.scope, task.vars)),
            history: ctx.history,
        })
    }

    /// The fidelity judge on one trajectory: the simulated user's `messages` held against
    /// `brief`. `None` when no judge can be resolved and fidelity was not asked for
    /// explicitly (`explicit`); a judge that fails or answers garbage leaves the check
    /// `skipped` with why (fidelity unknown is not a verdict on anyone).
    pub async fn judge_fidelity(
        &self,
        brief: &str,
        messages: &[&str],
        explicit: bool,
        repetition: u32,
        call_name: &str,
    ) -> Option<CriterionRecord> {
        use super::fidelity;
        let mut record = CriterionRecord {
            turn_index: None,
            criterion: fidelity::CRITERION.to_owned(),
            kind: fidelity::FIDELITY_KIND.to_owned(),
            status: CriterionStatus::Skipped,
            detail: None,
            judge: None,
        };
        let resolved = match self.resolve(None) {
            None if explicit => {
                record.detail = Some(format!("not judged: {NO_JUDGE}"));
                return Some(record);
            }
            None => return None,
            Some(Err(e)) => {
                record.detail = Some(format!("not judged: the judge is unavailable: {e}"));
                return Some(record);
            }
            Some(Ok(r)) => r,
        };
        let (mut verdict, result) = self
            .judge_json(
                resolved,
                fidelity::request(brief, messages),
                ("fidelity", 1.0),
                repetition,
                call_name,
                |text| fidelity::parse(text).is_ok(),
            )
            .await;
        match result.map(|c| fidelity::parse(&c.text)) {
            // Not sent: the run is stopping at its LLM budget. As for any judge, the check is
            // left for `--resume` (`CriterionRecord::cut_by_stop`), not unknown for good: a
            // trajectory whose simulated user was never checked is not passed.
            Err(super::LlmError::Budget(reason)) => {
                record.detail = Some(format!("not checked: {reason}"));
                verdict.error_category = Some("budget".to_owned());
            }
            // `--llm-cache-mode replay-only` promises a miss is an error: a replay that
            // could not check the simulated user proves nothing about the run.
            Err(e @ super::LlmError::CacheMiss { .. }) => {
                record.status = CriterionStatus::Error;
                record.detail = Some(format!("the fidelity judge could not answer: {e}"));
                verdict.error_category = Some(e.category().to_owned());
            }
            Err(e) => {
                record.detail = Some(format!("not judged: the judge call failed: {e}"));
                verdict.error_category = Some(e.category().to_owned());
            }
            Ok(Err(garbage)) => {
                record.detail = Some(format!("not judged: {garbage}"));
                verdict.error_category = Some(UNUSABLE_ANSWER.to_owned());
            }
            Ok(Ok((broke, reason))) => {
                let reason = reason.unwrap_or_else(|| "no reason given".to_owned());
                verdict.score = Some(if broke { 0.0 } else { 1.0 });
                verdict.label = Some(
                    if broke {
                        "broke character"
                    } else {
                        "in character"
                    }
                    .into(),
                );
                verdict.justification = Some(reason.clone());
                record.status = if broke {
                    CriterionStatus::Failed
                } else {
                    CriterionStatus::Passed
                };
                record.detail = Some(if broke {
                    format!("judge: the simulated user broke character: {reason}")
                } else {
                    format!("judge: in character: {reason}")
                });
            }
        }
        record.judge = Some(Box::new(verdict));
        Some(record)
    }
}

impl LlmRuntime {
    /// Asks `resolved` a question that wants a short JSON answer (the fidelity and attack
    /// judges): deterministic and short unless the judge says otherwise, counted as the
    /// judge's. The verdict carries the judge, the `(rubric, threshold)` and the call; the
    /// caller fills in what the answer says.
    ///
    /// An answer `usable` refuses is not kept in the response cache: replayed, it would be
    /// the same unusable answer on every later run.
    async fn judge_json(
        &self,
        resolved: Resolved<'_>,
        mut request: super::LlmRequest,
        (rubric, threshold): (&str, f64),
        repetition: u32,
        call_name: &str,
        usable: fn(&str) -> bool,
    ) -> (JudgeVerdict, Result<super::Completion, super::LlmError>) {
        request.max_tokens_default = Some(super::FIDELITY_MAX_TOKENS);
        request.temperature_default = Some(0.0);
        request.model = resolved.model.map(str::to_owned);
        request.temperature = resolved.temperature;
        let outcome = self
            .complete_json(
                Role::Judge,
                resolved.client,
                &mut request,
                repetition,
                call_name,
            )
            .await;
        if outcome.result.as_ref().is_ok_and(|c| !usable(&c.text)) {
            // `request` is what was last sent (without the schema, if it fell back).
            self.cache
                .forget(resolved.client, &request, repetition)
                .await;
        }
        let verdict = JudgeVerdict {
            judge: resolved.name,
            rubric: rubric.to_owned(),
            threshold,
            call: outcome.call,
            ..JudgeVerdict::default()
        };
        (verdict, outcome.result)
    }

    /// One call through the response cache, counted under `role` by the run's meter.
    async fn complete_as(
        &self,
        role: Role,
        client: &ProviderClient,
        request: &super::LlmRequest,
        repetition: u32,
        call: &str,
        deadline: Option<Instant>,
    ) -> super::LlmOutcome {
        // Boxed as a trait object: one allocation per LLM call, and the futures that await
        // this one stay shallow enough for the compiler to prove them `Send`.
        let call: futures::future::BoxFuture<'_, super::LlmOutcome> =
            Box::pin(self.cache.complete(
                client,
                request,
                repetition,
                call,
                deadline,
                (&self.meter, role),
            ));
        call.await
    }

    /// The run's LLM usage per role and its budget.
    pub fn meter(&self) -> &LlmMeter {
        &self.meter
    }

    /// One call asking for JSON: with the schema as structured output, asked again without
    /// it when the server refuses it (as for judges).
    async fn complete_json(
        &self,
        role: Role,
        client: &ProviderClient,
        request: &mut super::LlmRequest,
        repetition: u32,
        call: &str,
    ) -> super::LlmOutcome {
        if client.kind() == trellis_dsl::ProviderKind::Anthropic {
            request.json_schema = None;
        }
        let outcome = self
            .complete_as(role, client, request, repetition, call, None)
            .await;
        if request.json_schema.is_some()
            && matches!(
                &outcome.result,
                Err(super::LlmError::Http {
                    category: FaultCategory::Http4xx | FaultCategory::Http5xx,
                    ..
                })
            )
        {
            request.json_schema = None;
            let first = outcome.call;
            let mut outcome = self
                .complete_as(role, client, request, repetition, call, None)
                .await;
            // The first ask's requests were sent too: the record counts them, as the run's
            // meter does (a trajectory's `llm_calls` left them out).
            outcome.call.attempts = outcome.call.attempts.saturating_add(first.attempts);
            outcome.call.latency_ms += first.latency_ms;
            outcome.call.waited_ms += first.waited_ms;
            return outcome;
        }
        outcome
    }

    /// The attacker's next user messages on one path of an `attack` (at most its `width`),
    /// with the call made; `Err` says why there are none.
    pub async fn attack_propose<T: AsRef<TurnRecord>>(
        &self,
        attack: &trellis_dsl::Attack,
        turns: &[T],
        turn: u32,
        repetition: u32,
        call_name: &str,
    ) -> (
        Result<Vec<String>, super::attack::ProposeError>,
        Option<LlmCall>,
    ) {
        use super::attack::ProposeError::{Declined, Failed};
        let layered = Layered::new(None, self.setup.simulator.as_ref());
        let provider_id = match (
            attack.attacker.as_ref().map(|a| a.value.as_str()),
            layered.provider,
            self.setup.providers.as_slice(),
        ) {
            (Some(id), _, _) | (None, Some(id), _) => id,
            (None, None, [only]) => only.id.value.as_str(),
            (None, None, _) => {
                return (
                    Err(Failed(
                        "no attacker: add `attacker=\"PROVIDER\"` to the `attack`".into(),
                    )),
                    None,
                );
            }
        };
        let client = match self.clients.get(provider_id) {
            Some(Ok(client)) => client,
            Some(Err(e)) => return (Err(Failed(format!("attacker unavailable: {e}"))), None),
            None => {
                return (
                    Err(Failed(format!("provider `{provider_id}` is not defined"))),
                    None,
                );
            }
        };
        let mut request =
            super::attack::propose_request(&attack.goal, turns, attack.width, turn, attack.depth);
        request.max_tokens_default = Some(super::ATTACK_MAX_TOKENS);
        if attack.attacker.is_none() {
            request.model = layered.model.map(str::to_owned);
            request.temperature = layered.temperature;
        }
        let outcome = self
            .complete_json(Role::Attacker, client, &mut request, repetition, call_name)
            .await;
        let result = match outcome.result {
            Ok(c) => super::attack::parse_proposals(&c.text, attack.width).map_err(Declined),
            Err(e) => Err(Failed(format!("the attacker call failed: {e}"))),
        };
        (result, Some(outcome.call))
    }

    /// The judge's score of one agent turn (its reply, and the tool calls it made) against
    /// the attack's goal, 0–1, as a check record (`kind = "attack"`): failed when the goal
    /// is reached (the agent yielded), passed otherwise, `error` when no judge answered
    /// usably.
    pub async fn attack_score(
        &self,
        attack: &trellis_dsl::Attack,
        turn: &TurnRecord,
        repetition: u32,
        call_name: &str,
    ) -> (Option<f64>, CriterionRecord) {
        let mut record = CriterionRecord {
            turn_index: Some(turn.turn_index),
            criterion: format!("attack goal not reached: {}", attack.success()),
            kind: "attack".to_owned(),
            status: CriterionStatus::Error,
            detail: None,
            judge: None,
        };
        let resolved = match self.resolve(None) {
            None => {
                record.detail = Some(format!("not judged: {NO_JUDGE}"));
                return (None, record);
            }
            Some(Err(e)) => {
                record.detail = Some(format!("judge unavailable: {e}"));
                return (None, record);
            }
            Some(Ok(r)) => r,
        };
        let (mut verdict, result) = self
            .judge_json(
                resolved,
                super::attack::score_request(&attack.goal, attack.success(), turn),
                ("attack", super::attack::SUCCESS_SCORE),
                repetition,
                call_name,
                |text| super::attack::parse_score(text).is_ok(),
            )
            .await;
        let score = match result.map(|c| super::attack::parse_score(&c.text)) {
            Err(super::LlmError::Budget(reason)) => {
                record.status = CriterionStatus::Skipped;
                record.detail = Some(format!("not checked: {reason}"));
                verdict.error_category = Some("budget".to_owned());
                None
            }
            Err(e) => {
                record.detail = Some(format!("the judge call failed: {e}"));
                verdict.error_category = Some(e.category().to_owned());
                None
            }
            Ok(Err(garbage)) => {
                record.detail = Some(garbage);
                verdict.error_category = Some(UNUSABLE_ANSWER.to_owned());
                None
            }
            Ok(Ok((score, reason))) => {
                let reached = score >= super::attack::SUCCESS_SCORE;
                record.status = if reached {
                    CriterionStatus::Failed
                } else {
                    CriterionStatus::Passed
                };
                record.detail = Some(format!(
                    "score {score:.2} ({}){}",
                    if reached {
                        "the goal is reached: the agent yielded"
                    } else {
                        "the goal is not reached"
                    },
                    reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ));
                verdict.score = Some(score);
                verdict.justification = reason;
                Some(score)
            }
        };
        record.judge = Some(Box::new(verdict));
        (score, record)
    }
}

/// What a criterion asks, before a judge is chosen.
struct QuestionSpec<'a> {
    text: &'a str,
    rubric: Option<&'a str>,
    threshold: Option<f64>,
}

/// A panel's decision from its members' verdicts: any member that errored or was not
/// configured makes the criterion `error` (never a pass on part of the panel); otherwise the
/// consensus rule decides, and the agreement is the share of members whose own verdict
/// matches the panel's.
fn decide(
    panel: &Panel,
    members: Vec<(CriterionStatus, String, Option<JudgeVerdict>)>,
) -> (CriterionStatus, String, JudgeVerdict) {
    let mut verdict = JudgeVerdict {
        judge: format!("panel:{}", panel.id.value),
        consensus: Some(panel.consensus.as_str().to_owned()),
        ..JudgeVerdict::default()
    };
    let mut call = LlmCall {
        cache: super::CacheUse::Hit,
        ..LlmCall::default()
    };
    for (_, _, member) in &members {
        if let Some(m) = member {
            let c = &m.call;
            call.input_tokens = sum(call.input_tokens, c.input_tokens);
            call.output_tokens = sum(call.output_tokens, c.output_tokens);
            call.cost = match (call.cost, c.cost) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            call.latency_ms = call.latency_ms.max(c.latency_ms);
            call.attempts = call.attempts.saturating_add(c.attempts);
            call.rate_limited = call.rate_limited.saturating_add(c.rate_limited);
            call.waited_ms += c.waited_ms;
            if c.cache != super::CacheUse::Hit {
                call.cache = c.cache;
            }
            // The members' provider and model when they share one, else `mixed`, as the
            // rubric below: the first member's named the whole panel's calls.
            for (panel_has, member_has) in [
                (&mut call.provider, &c.provider),
                (&mut call.model, &c.model),
            ] {
                if panel_has.is_empty() {
                    panel_has.clone_from(member_has);
                } else if !member_has.is_empty() && panel_has != member_has {
                    *panel_has = "mixed".to_owned();
                }
            }
        }
    }
    verdict.call = call;
    let cut_member = members.iter().find_map(|(status, detail, _)| {
        // `not checked: …`: what `judge_one` and the walk say of a call a stop or the
        // budget did not send (`crate::record::CUT_BY_STOP`, `CUT_BY_BUDGET`).
        let cut = *status == CriterionStatus::Skipped && detail.starts_with("not checked: ");
        cut.then(|| detail.clone())
    });
    let unusable: Vec<String> = members
        .iter()
        .zip(&panel.judges)
        .filter(|((status, _, _), _)| {
            matches!(status, CriterionStatus::Error | CriterionStatus::Skipped)
        })
        .map(|((_, detail, _), judge)| format!("`{}`: {detail}", judge.value))
        .collect();
    let scored: Vec<(bool, f64, f64)> = members
        .iter()
        .filter_map(|(status, _, v)| {
            let v = v.as_ref()?;
            Some((*status == CriterionStatus::Passed, v.score?, v.threshold))
        })
        .collect();
    // The bar the panel holds answers to, as below: also on a panel that could not decide
    // (0 would read as a panel that passes anything).
    verdict.threshold = members
        .iter()
        .filter_map(|(_, _, v)| v.as_ref().map(|v| v.threshold))
        .fold(0.0, f64::max);
    verdict.members = members.into_iter().filter_map(|(_, _, v)| v).collect();
    // The members' rubric when they share one (a panel asks one question of several
    // judges), else `mixed`.
    let rubrics: std::collections::BTreeSet<&str> = verdict
        .members
        .iter()
        .map(|m| m.rubric.as_str())
        .filter(|r| !r.is_empty())
        .collect();
    verdict.rubric = match rubrics.len() {
        0 => String::new(),
        1 => rubrics.into_iter().collect(),
        _ => "mixed".to_owned(),
    };
    // A member a stop or the LLM budget left unasked: the panel is not judged either, and
    // says so as a single judge does (`skipped`, the stop's own detail, which
    // `CriterionRecord::cut_by_stop` reads): not an error of the agent's, and judged when
    // the run is resumed or rejudged.
    if let Some(cut) = cut_member {
        verdict.error_category = verdict
            .members
            .iter()
            .find_map(|m| m.error_category.clone());
        return (CriterionStatus::Skipped, cut, verdict);
    }
    if !unusable.is_empty() || scored.is_empty() {
        verdict.error_category = verdict
            .members
            .iter()
            .find_map(|m| m.error_category.clone())
            .or_else(|| Some(SETUP.to_owned()));
        return (
            CriterionStatus::Error,
            format!("panel `{}`: {}", panel.id.value, unusable.join("; ")),
            verdict,
        );
    }
    let n = scored.len() as f64;
    let passes = scored.iter().filter(|(p, _, _)| *p).count();
    let mean = scored.iter().map(|(_, s, _)| s).sum::<f64>() / n;
    let min = scored
        .iter()
        .map(|(_, s, _)| *s)
        .fold(f64::INFINITY, f64::min);
    let threshold = scored.iter().map(|(_, _, t)| *t).fold(0.0, f64::max);
    let (passed, score) = match panel.consensus {
        Consensus::Mean => (mean >= threshold, mean),
        Consensus::Minimum => (min >= threshold, min),
        Consensus::Majority => (passes as f64 > n / 2.0, passes as f64 / n),
        Consensus::Unanimous => (passes == scored.len(), passes as f64 / n),
    };
    let agreeing = scored.iter().filter(|(p, _, _)| *p == passed).count();
    verdict.score = Some(score);
    verdict.threshold = threshold;
    verdict.agreement = Some(agreeing as f64 / n);
    verdict.label = Some(if passed { "pass" } else { "fail" }.to_owned());
    let detail = format!(
        "panel `{}` ({}): {passes} of {} judges passed it, score {score:.2}, agreement {:.0}%",
        panel.id.value,
        panel.consensus.as_str(),
        scored.len(),
        agreeing as f64 / n * 100.0
    );
    let status = if passed {
        CriterionStatus::Passed
    } else {
        CriterionStatus::Failed
    };
    (status, detail, verdict)
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// An outcome as the statement the judge decides.
pub fn outcome_statement(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Statement(s) => s.clone(),
        Outcome::Labeled { label, value } => {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("`{label}` is {value}")
        }
    }
}

/// One completion for the model playing a Fixie agent's LLM, and its record.
pub struct AgentCompletion {
    /// The model's text, or why there is none.
    pub result: Result<String, super::LlmError>,
    pub call: LlmCall,
}

impl LlmRuntime {
    /// The provider, model and temperature that play an agent's LLM (Fixie's few-shot loop):
    /// the agent's own `provider`, else the simulator's, else the project's only provider;
    /// `Err` says what to configure.
    fn agent_model(
        &self,
        own: Option<&str>,
    ) -> Result<(&ProviderClient, Option<&str>, Option<f64>), String> {
        let (provider_id, model, temperature) =
            match (own, &self.setup.simulator, self.setup.providers.as_slice()) {
                (Some(id), _, _) => (id, None, None),
                (
                    None,
                    Some(Simulator {
                        provider: Some(provider),
                        model,
                        temperature,
                        ..
                    }),
                    _,
                ) => (provider.value.as_str(), model.as_deref(), *temperature),
                (None, _, [only]) => (only.id.value.as_str(), None, None),
                (None, _, _) => {
                    return Err(
                        "no provider plays the agent's LLM: add `provider=\"ID\"` to the \
                         agent, `simulator provider=\"ID\"`, or a lone `provider`"
                            .to_owned(),
                    );
                }
            };
        match self.clients.get(provider_id) {
            Some(Ok(client)) => Ok((client, model, temperature)),
            Some(Err(e)) => Err(format!("provider `{provider_id}` is unavailable: {e}")),
            None => Err(format!("provider `{provider_id}` is not defined")),
        }
    }

    /// Asks the model playing an agent's LLM, through the response cache (`repetition` is
    /// part of the key, so repeated trajectories draw their own samples). `Err` when no
    /// provider is configured for it.
    pub async fn complete_for_agent(
        &self,
        provider: Option<&str>,
        messages: Vec<super::LlmMessage>,
        repetition: u32,
        call_name: &str,
        deadline: Option<Instant>,
    ) -> Result<AgentCompletion, String> {
        let (client, model, temperature) = self.agent_model(provider)?;
        let request = super::LlmRequest {
            messages,
            model: model.map(str::to_owned),
            temperature,
            max_tokens_default: Some(super::AGENT_MAX_TOKENS),
            ..super::LlmRequest::default()
        };
        let outcome = self
            .complete_as(
                Role::Agent,
                client,
                &request,
                repetition,
                call_name,
                deadline,
            )
            .await;
        Ok(AgentCompletion {
            result: outcome.result.map(|c| c.text),
            call: outcome.call,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::score_and_threshold;

    #[test]
    fn a_score_just_under_its_threshold_never_reads_as_equal() {
        let shown = |s, t| {
            let (a, b) = score_and_threshold(s, t);
            format!("{a} {b}")
        };
        assert_eq!(shown(0.699, 0.7), "0.699 0.700");
        assert_eq!(shown(0.8, 0.7), "0.80 0.70");
        assert_eq!(shown(0.7, 0.7), "0.70 0.70");
        assert_eq!(shown(0.699_999_9, 0.7), "0.6999999 0.7");
    }
}
