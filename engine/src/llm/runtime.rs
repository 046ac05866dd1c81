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

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;
use trellis_dsl::{
    CriterionKind, Judge, Outcome, Persona, PersonaRef, Project, Provider, Scenario, Simulator,
};

use super::judge::{self, JudgeContext, JudgeVerdict, PersonaInfo, Question, Rubric};
use super::simulator::{self, Character, SIMULATOR_RETRIES, Said};
use super::{LlmCache, LlmCall, ProviderClient};
use crate::protocol::http::HttpTransport;
use crate::record::{CriterionRecord, CriterionStatus, Fault, FaultCategory, TurnRecord};
use crate::render::EnvSnapshot;

/// The project's LLM configuration, carried by the plan.
#[derive(Clone, Debug, Default)]
pub struct LlmSetup {
    pub providers: Vec<Provider>,
    pub judges: Vec<Judge>,
    pub simulator: Option<Simulator>,
    pub personas: Vec<Persona>,
    /// The simulator's `instructions`, compiled by the planner (rendered per trajectory).
    pub simulator_instructions: Option<crate::render::CompiledTemplate>,
}

impl LlmSetup {
    pub fn from_project(project: &Project) -> Self {
        LlmSetup {
            providers: project.providers.clone(),
            judges: project.judges.clone(),
            simulator: project.simulator.clone(),
            personas: project.personas.clone(),
            simulator_instructions: None,
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

/// A judge ready to call.
struct Resolved<'a> {
    name: String,
    client: &'a ProviderClient,
    model: Option<&'a str>,
    temperature: Option<f64>,
    rubric: Option<&'a str>,
    threshold: Option<f64>,
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
    /// Names the call in a replay-only cache miss.
    pub call_name: String,
}

/// The providers, judges and cache of a run.
pub struct LlmRuntime {
    setup: LlmSetup,
    clients: HashMap<String, Result<ProviderClient, String>>,
    cache: LlmCache,
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
        let clients = setup
            .providers
            .iter()
            .map(|p| {
                (
                    p.id.value.clone(),
                    ProviderClient::new(p, env, transport.clone()).map_err(|e| e.to_string()),
                )
            })
            .collect();
        Arc::new(LlmRuntime {
            setup,
            clients,
            cache,
        })
    }

    pub fn setup(&self) -> &LlmSetup {
        &self.setup
    }

    /// Whether `kind` is judged by an LLM.
    pub fn is_judged(kind: &CriterionKind) -> bool {
        matches!(
            kind,
            CriterionKind::Judge { .. } | CriterionKind::Outcome(_)
        )
    }

    fn resolve(&self, named: Option<&str>) -> Option<Result<Resolved<'_>, String>> {
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
                return Some(Err(format!(
                    "judge `{}` is not defined",
                    named.unwrap_or("")
                )));
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
            Some(Err(e)) => Err(e.clone()),
            None => Err(format!("provider `{provider_id}` is not defined")),
        })
    }

    /// Judges one `judge`/`outcome` criterion (or a scenario-level outcome) into its record:
    /// passed or failed on the judge's score, `skipped` without a judge, `error` when the
    /// judge failed or answered garbage.
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
        let resolved = match self.resolve(named) {
            None => {
                record.detail = Some(NO_JUDGE.to_owned());
                return record;
            }
            Some(Err(e)) => {
                record.status = CriterionStatus::Error;
                record.detail = Some(format!("judge unavailable: {e}"));
                return record;
            }
            Some(Ok(r)) => r,
        };
        let rubric = match task.kind {
            CriterionKind::Outcome(_) => Rubric::Outcome,
            _ => Rubric::from_setting(
                criterion_rubric
                    .or(task.scenario.criteria_override.as_deref())
                    .or(resolved.rubric),
            ),
        };
        let threshold = criterion_threshold
            .or(resolved.threshold)
            .unwrap_or_else(|| rubric.default_threshold());
        let ctx = self.context(task.scenario);
        let question = Question {
            criterion: &question_text,
            rubric: &rubric,
            turn: task.turn_index,
        };
        let mut request = judge::request(&ctx, &question, task.turns);
        request.model = resolved.model.map(str::to_owned);
        request.temperature = resolved.temperature;
        if resolved.client.kind() == trellis_dsl::ProviderKind::Anthropic {
            // No structured output there: the prompt asks for JSON and parsing is strict.
            request.json_schema = None;
        }
        let outcome = self
            .cache
            .complete(
                resolved.client,
                &request,
                task.repetition,
                &task.call_name,
                None::<Instant>,
            )
            .await;
        let mut verdict = JudgeVerdict {
            judge: resolved.name,
            rubric: rubric.name().to_owned(),
            threshold,
            call: outcome.call,
            ..JudgeVerdict::default()
        };
        match outcome.result {
            Err(e) => {
                record.status = CriterionStatus::Error;
                record.detail = Some(format!("the judge call failed: {e}"));
            }
            Ok(completion) => match judge::parse_answer(&rubric, &completion.text) {
                Err(garbage) => {
                    record.status = CriterionStatus::Error;
                    record.detail = Some(garbage.to_string());
                }
                Ok(answer) => {
                    let passed = answer.score >= threshold;
                    record.status = if passed {
                        CriterionStatus::Passed
                    } else {
                        CriterionStatus::Failed
                    };
                    record.detail = Some(format!(
                        "score {:.2} {} {:.2}{}",
                        answer.score,
                        if passed { ">=" } else { "<" },
                        threshold,
                        answer
                            .justification
                            .as_deref()
                            .map(|j| format!(": {j}"))
                            .unwrap_or_default()
                    ));
                    verdict.score = Some(answer.score);
                    verdict.label = answer.label;
                    verdict.justification = answer.justification;
                    verdict.metrics = answer.metrics;
                }
            },
        }
        record.judge = Some(Box::new(verdict));
        record
    }

    fn context<'a>(&'a self, scenario: &'a Scenario) -> JudgeContext<'a> {
        let persona = match &scenario.persona {
            Some(PersonaRef::Named(id)) => {
                self.setup.personas.iter().find(|p| p.id.value == id.value)
            }
            Some(PersonaRef::Inline(p)) => Some(p),
            None => None,
        };
        JudgeContext {
            scenario: &scenario.id.value,
            description: scenario.description.as_deref(),
            persona: persona.map(|p| PersonaInfo {
                kind: p.kind.clone(),
                description: p.description.clone(),
                instructions: p.instructions.clone(),
            }),
            user_context: Some(&scenario.user_context),
            expected_tools: scenario
                .expect_tools
                .iter()
                .filter_map(|c| match &c.kind {
                    CriterionKind::Tool { name, params, .. } => {
                        Some((name.clone(), params.clone()))
                    }
                    _ => None,
                })
                .collect(),
            outcomes: scenario
                .outcomes
                .iter()
                .map(|o| outcome_statement(&o.value))
                .collect(),
        }
    }
}

/// One `simulate` turn to write.
pub struct SimulateTask<'a, T> {
    pub scenario: &'a Scenario,
    pub turns: &'a [T],
    pub repetition: u32,
    /// The simulator's `instructions`, rendered for this path.
    pub instructions: Option<String>,
    /// Names the call in a replay-only cache miss.
    pub call_name: String,
}

/// What the simulated user said, and the LLM calls it took (retries included).
#[derive(Clone, Debug)]
pub struct Simulated {
    pub said: Said,
    pub calls: Vec<LlmCall>,
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
        let (provider_id, model, temperature) =
            match (&self.setup.simulator, self.setup.providers.as_slice()) {
                (Some(s), _) => (s.provider.value.as_str(), s.model.as_deref(), s.temperature),
                (None, [only]) => (only.id.value.as_str(), None, None),
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
        let ctx = self.context(task.scenario);
        let character = Character {
            persona: ctx.persona,
            user_context: ctx.user_context,
            description: ctx.description,
            instructions: task.instructions,
        };
        let mut calls = Vec::new();
        let mut last_answer = String::new();
        for retry in 0..=SIMULATOR_RETRIES {
            let mut request = simulator::request(&character, task.turns, retry);
            request.model = model.map(str::to_owned);
            request.temperature = temperature;
            let outcome = self
                .cache
                .complete(
                    client,
                    &request,
                    task.repetition,
                    &task.call_name,
                    None::<Instant>,
                )
                .await;
            calls.push(outcome.call);
            let text = match outcome.result {
                Ok(c) => c.text,
                // An empty completion is an unusable answer, asked again like one.
                Err(super::LlmError::Malformed { detail, .. }) if detail.contains("no text") => {
                    String::new()
                }
                Err(e) => return Err((fault(format!("the simulator call failed: {e}")), calls)),
            };
            match simulator::interpret(&text) {
                Said::Unusable => last_answer = text,
                said => return Ok(Simulated { said, calls }),
            }
        }
        let mut shown: String = last_answer.trim().chars().take(160).collect();
        if shown.is_empty() {
            shown = "(empty)".into();
        }
        Err((
            fault(format!(
                "the simulator gave no usable message in {} attempts; last answer: {shown:?}",
                SIMULATOR_RETRIES + 1
            )),
            calls,
        ))
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
