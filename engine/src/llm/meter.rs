//! What a run spends on language models, per role, and the budget that stops it.
//!
//! Every LLM call of a run is counted once, where it is made, under its role: `simulator`
//! (the simulated user), `judge` (judged checks, panels' members, the fidelity judge),
//! `agent` (a model under test as its turns report it, Fixie's LLM) and `attacker`
//! (attack search). Counting at the source, not from trajectories, counts a shared prefix's
//! calls once however many branches continue it.
//!
//! `--max-llm-calls` and `--max-llm-cost` ([`Budget`]) stop the run gracefully when reached:
//! the meter cancels the run's stop token, as Ctrl-C does, so no new call starts, calls in
//! flight finish (at most `--jobs` of them past the limit) and finished trajectories are
//! recorded. Cache hits send nothing and cost nothing: they count in the usage, not against
//! the call budget.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::record::{CacheUse, LlmCall, LlmUsage};

/// Who an LLM call works for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Agent,
    Simulator,
    Judge,
    Attacker,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Simulator => "simulator",
            Role::Judge => "judge",
            Role::Attacker => "attacker",
        }
    }
}

/// The run's limits on LLM use (`--max-llm-calls`, `--max-llm-cost`); none by default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Budget {
    /// Calls sent to a provider (cache hits excluded).
    pub max_calls: Option<u64>,
    /// Cost in the providers' price unit (`input-price`/`output-price`).
    pub max_cost: Option<f64>,
}

#[derive(Default)]
struct Spent {
    roles: BTreeMap<Role, LlmUsage>,
    /// Calls sent (not answered from the cache).
    sent: u64,
    cost: f64,
}

/// The run's LLM usage per role, and its budget once armed.
#[derive(Default)]
pub struct LlmMeter {
    spent: Mutex<Spent>,
    armed: OnceLock<(Budget, CancellationToken)>,
    /// Why the budget stopped the run, once it did.
    tripped: OnceLock<String>,
}

impl std::fmt::Debug for LlmMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmMeter")
            .field("tripped", &self.tripped.get())
            .finish_non_exhaustive()
    }
}

impl LlmMeter {
    /// Stops the run through `stop` once `budget` is reached (once per run; later calls
    /// are ignored).
    pub fn arm(&self, budget: Budget, stop: CancellationToken) {
        if budget != Budget::default() {
            let _ = self.armed.set((budget, stop));
        }
    }

    /// Counts one call of `role`.
    pub fn record(&self, role: Role, call: &LlmCall) {
        let sent = call.cache != CacheUse::Hit && call.attempts > 0;
        self.add(role, call, sent);
    }

    /// Counts an agent turn's own model use, as the agent reported it (tokens, cost): one
    /// call.
    pub fn record_agent_turn(
        &self,
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
        cost: Option<f64>,
    ) {
        let call = LlmCall {
            input_tokens,
            output_tokens,
            cost,
            attempts: 1,
            ..LlmCall::default()
        };
        self.add(Role::Agent, &call, true);
    }

    fn add(&self, role: Role, call: &LlmCall, sent: bool) {
        let (calls, cost) = {
            let Ok(mut spent) = self.spent.lock() else {
                return;
            };
            spent.roles.entry(role).or_default().add(call);
            if sent {
                spent.sent += 1;
            }
            spent.cost += call.cost.unwrap_or(0.0);
            (spent.sent, spent.cost)
        };
        let Some((budget, stop)) = self.armed.get() else {
            return;
        };
        let reason = match (budget.max_calls, budget.max_cost) {
            (Some(max), _) if calls >= max => Some(format!(
                "--max-llm-calls {max} reached ({calls} calls sent)"
            )),
            (_, Some(max)) if cost >= max => {
                Some(format!("--max-llm-cost {max} reached (cost {cost:.4})"))
            }
            _ => None,
        };
        if let Some(reason) = reason
            && self.tripped.set(reason).is_ok()
        {
            stop.cancel();
        }
    }

    /// Usage per role (`agent`, `simulator`, `judge`, `attacker`), roles without calls left
    /// out.
    pub fn by_role(&self) -> BTreeMap<String, LlmUsage> {
        self.spent
            .lock()
            .map(|s| {
                s.roles
                    .iter()
                    .map(|(role, usage)| (role.as_str().to_owned(), *usage))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Why the budget stopped the run, if it did.
    pub fn tripped(&self) -> Option<String> {
        self.tripped.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(cost: f64, cache: CacheUse) -> LlmCall {
        LlmCall {
            input_tokens: Some(10),
            output_tokens: Some(2),
            cost: Some(cost),
            attempts: u32::from(cache != CacheUse::Hit),
            cache,
            ..LlmCall::default()
        }
    }

    #[test]
    fn roles_are_counted_apart_and_the_call_budget_stops_the_run_once() {
        let meter = LlmMeter::default();
        let stop = CancellationToken::new();
        meter.arm(
            Budget {
                max_calls: Some(2),
                max_cost: None,
            },
            stop.clone(),
        );
        meter.record(Role::Simulator, &call(0.5, CacheUse::Miss));
        // A cache hit sends nothing: not against the budget.
        meter.record(Role::Judge, &call(0.0, CacheUse::Hit));
        assert!(!stop.is_cancelled());
        meter.record(Role::Judge, &call(0.5, CacheUse::Miss));
        assert!(stop.is_cancelled());
        assert_eq!(
            meter.tripped().as_deref(),
            Some("--max-llm-calls 2 reached (2 calls sent)")
        );
        let roles = meter.by_role();
        assert_eq!(roles["judge"].calls, 2);
        assert_eq!(roles["judge"].cache_hits, 1);
        assert_eq!(roles["simulator"].calls, 1);
        assert!(!roles.contains_key("agent"));
    }

    #[test]
    fn the_cost_budget_counts_every_role() {
        let meter = LlmMeter::default();
        let stop = CancellationToken::new();
        meter.arm(
            Budget {
                max_calls: None,
                max_cost: Some(1.0),
            },
            stop.clone(),
        );
        meter.record_agent_turn(Some(5), Some(5), Some(0.6));
        assert!(!stop.is_cancelled());
        meter.record(Role::Simulator, &call(0.4, CacheUse::Miss));
        assert!(stop.is_cancelled());
        assert!(
            meter
                .tripped()
                .is_some_and(|r| r.starts_with("--max-llm-cost 1"))
        );
    }
}
