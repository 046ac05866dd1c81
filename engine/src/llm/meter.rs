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
//! flight finish and finished trajectories are recorded. A call the engine makes is admitted
//! before it is sent ([`LlmMeter::admit`]): with `--max-llm-calls N`, calls sent and calls in
//! flight together never pass N, however many trajectories ask at once (fifty simulated users
//! starting together under `--max-llm-calls 1` sent fifty calls when the count was only
//! taken as answers came back). A cost is known only once a call is answered, so
//! `--max-llm-cost` can be passed by the calls in flight when it is reached. Cache hits send
//! nothing and cost nothing: they count in the usage, not against the call budget.

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
    /// Calls admitted and not yet answered.
    in_flight: u64,
    /// Of `sent`, calls admitted and then abandoned unanswered (their trajectory cut off as
    /// the run stopped): counted as sent, since they may have reached the provider.
    abandoned: u64,
    cost: f64,
}

/// Which limit stopped the run; said with the counts at the run's end
/// ([`LlmMeter::tripped`]).
#[derive(Clone, Copy, Debug)]
enum Trip {
    Calls(u64),
    Cost(f64),
}

/// The run's LLM usage per role, and its budget once armed.
#[derive(Default)]
pub struct LlmMeter {
    spent: Mutex<Spent>,
    armed: OnceLock<(Budget, CancellationToken)>,
    /// Which limit stopped the run, once one did.
    tripped: OnceLock<Trip>,
    /// A call was refused (`--max-llm-calls`): work the run did not do.
    refused: std::sync::atomic::AtomicBool,
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

    /// Counts one call of `role` that was not admitted (answered from the cache, or failed
    /// before anything was sent).
    pub fn record(&self, role: Role, call: &LlmCall) {
        let sent = call.cache != CacheUse::Hit && call.attempts > 0;
        self.add(role, call, sent, false, true);
    }

    /// Lets one call be sent, unless `--max-llm-calls` leaves no room for it: then the run
    /// is stopped (as when the budget is reached) and `Err` says why. The call is counted
    /// by [`LlmMeter::record_admitted`]; an admission dropped without that (a call
    /// abandoned in flight) counts as sent.
    pub fn admit(&self) -> Result<Admission<'_>, String> {
        let max = self.armed.get().and_then(|(budget, _)| budget.max_calls);
        if let Some(max) = max {
            let refused = {
                let Ok(mut spent) = self.spent.lock() else {
                    return Err("the LLM meter is unavailable".to_owned());
                };
                if spent.sent.saturating_add(spent.in_flight) >= max {
                    Some((spent.sent, spent.in_flight))
                } else {
                    spent.in_flight += 1;
                    None
                }
            };
            if let Some((sent, in_flight)) = refused {
                self.refused
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // Calls in flight hold their place; said apart, as they may yet be abandoned
                // unsent (a judge the stopping run no longer waits for).
                let reason = if in_flight == 0 {
                    format!("--max-llm-calls {max} reached ({sent} calls sent)")
                } else {
                    format!(
                        "--max-llm-calls {max} reached ({sent} calls sent, {in_flight} in flight)"
                    )
                };
                self.trip(Trip::Calls(max));
                return Err(format!("not sent: {reason}"));
            }
        }
        Ok(Admission {
            meter: self,
            counted: max.is_none(),
        })
    }

    /// Counts a call [`LlmMeter::admit`] let through, now answered (or failed).
    pub fn record_admitted(&self, role: Role, call: &LlmCall, mut admission: Admission<'_>) {
        let in_flight = !admission.counted;
        admission.counted = true;
        let sent = call.cache != CacheUse::Hit && call.attempts > 0;
        self.add(role, call, sent, in_flight, true);
    }

    /// Counts one request of a model API under test ([`crate::protocol::CallContext`]'s
    /// `llm_meter`), admitted before it was sent, with the usage it reported.
    pub fn record_model_request(
        &self,
        usage: Option<crate::transport::Usage>,
        attempts: usize,
        admission: Admission<'_>,
    ) {
        let call = LlmCall {
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
            cost: usage.and_then(|u| u.cost),
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            ..LlmCall::default()
        };
        self.record_admitted(Role::Agent, &call, admission);
    }

    /// Counts an agent turn's own model use, as the agent reported it (tokens, cost): one
    /// call, shown but not against the budget (Trellis cannot bound what an agent's own
    /// model does, and a run with no LLM of its own must not stop at `--max-llm-calls`; a
    /// model API under test is counted request by request instead,
    /// [`LlmMeter::record_model_request`]).
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
        self.add(Role::Agent, &call, false, false, false);
    }

    /// `held_place`: the call held a place among the calls in flight, given back now;
    /// `costed`: its cost counts against `--max-llm-cost`.
    fn add(&self, role: Role, call: &LlmCall, sent: bool, held_place: bool, costed: bool) {
        let (calls, cost) = {
            let Ok(mut spent) = self.spent.lock() else {
                return;
            };
            spent.roles.entry(role).or_default().add(call);
            if sent {
                spent.sent += 1;
            }
            if held_place {
                spent.in_flight = spent.in_flight.saturating_sub(1);
            }
            if costed {
                spent.cost += call.cost.unwrap_or(0.0);
            }
            (spent.sent, spent.cost)
        };
        let Some((budget, _)) = self.armed.get() else {
            return;
        };
        let trip = match (budget.max_calls, budget.max_cost) {
            (Some(max), _) if calls >= max => Some(Trip::Calls(max)),
            (_, Some(max)) if cost >= max => Some(Trip::Cost(max)),
            _ => None,
        };
        if let Some(trip) = trip {
            self.trip(trip);
        }
    }

    /// Stops the run for `trip`, the first time.
    fn trip(&self, trip: Trip) {
        if let Some((_, stop)) = self.armed.get()
            && self.tripped.set(trip).is_ok()
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

    /// Whether a call was refused: a check, a simulated turn or an attack step the run
    /// then did without.
    pub fn refused_any(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why the budget stopped the run, if it did, with what was spent by now.
    pub fn tripped(&self) -> Option<String> {
        let trip = *self.tripped.get()?;
        let (sent, abandoned, cost) = self
            .spent
            .lock()
            .map(|s| (s.sent, s.abandoned, s.cost))
            .unwrap_or_default();
        Some(match trip {
            Trip::Calls(max) if abandoned > 0 => format!(
                "--max-llm-calls {max} reached ({} answered, {abandoned} abandoned \
                 unanswered as the run stopped)",
                sent - abandoned
            ),
            Trip::Calls(max) => format!("--max-llm-calls {max} reached ({sent} calls sent)"),
            Trip::Cost(max) => format!("--max-llm-cost {max} reached (cost {cost:.4})"),
        })
    }
}

/// A call's place under `--max-llm-calls` ([`LlmMeter::admit`]).
pub struct Admission<'a> {
    meter: &'a LlmMeter,
    /// Nothing left to give back: counted, or no call budget to count against.
    counted: bool,
}

impl Drop for Admission<'_> {
    /// A call abandoned in flight (its trajectory cut off) may well have reached the
    /// provider: it stays counted as sent.
    fn drop(&mut self) {
        if !self.counted
            && let Ok(mut spent) = self.meter.spent.lock()
        {
            spent.in_flight = spent.in_flight.saturating_sub(1);
            spent.sent += 1;
            spent.abandoned += 1;
        }
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
        let usage = crate::transport::Usage {
            prompt_tokens: Some(5),
            completion_tokens: Some(5),
            total_tokens: None,
            cost: Some(0.6),
        };
        meter.record_model_request(Some(usage), 1, meter.admit().unwrap());
        assert!(!stop.is_cancelled());
        meter.record(Role::Simulator, &call(0.4, CacheUse::Miss));
        assert!(stop.is_cancelled());
        assert!(
            meter
                .tripped()
                .is_some_and(|r| r.starts_with("--max-llm-cost 1"))
        );
    }

    #[test]
    fn calls_in_flight_hold_their_place_under_the_call_budget() {
        let meter = LlmMeter::default();
        let stop = CancellationToken::new();
        meter.arm(
            Budget {
                max_calls: Some(2),
                max_cost: None,
            },
            stop.clone(),
        );
        // Two calls admitted at once, neither answered yet: a third is not sent.
        let first = meter.admit().unwrap();
        let second = meter.admit().unwrap();
        let refused = meter.admit().err().unwrap();
        assert_eq!(
            refused,
            "not sent: --max-llm-calls 2 reached (0 calls sent, 2 in flight)"
        );
        assert!(stop.is_cancelled(), "the refusal stops the run");
        assert!(
            meter.refused_any(),
            "a refused call is work the run did not do"
        );
        meter.record_admitted(Role::Simulator, &call(0.1, CacheUse::Miss), first);
        // A call abandoned in flight may have reached the provider: it stays counted, and
        // the end says which were answered.
        drop(second);
        assert!(meter.admit().is_err());
        assert_eq!(meter.by_role()["simulator"].calls, 1);
        assert_eq!(
            meter.tripped().as_deref(),
            Some(
                "--max-llm-calls 2 reached (1 answered, 1 abandoned unanswered as the run \
                 stopped)"
            )
        );
        let meter = LlmMeter::default();
        meter.arm(
            Budget {
                max_calls: Some(2),
                max_cost: None,
            },
            CancellationToken::new(),
        );
        let answered = meter.admit().unwrap();
        meter.record_admitted(Role::Judge, &call(0.1, CacheUse::Miss), answered);
        let last = meter.admit().expect("one place left");
        assert!(meter.admit().is_err());
        meter.record_admitted(Role::Judge, &call(0.1, CacheUse::Miss), last);
        assert_eq!(meter.by_role()["judge"].calls, 2);

        // Without a call budget every call is admitted.
        let free = LlmMeter::default();
        let admitted: Vec<_> = (0..100).map(|_| free.admit().unwrap()).collect();
        assert_eq!(admitted.len(), 100);
    }

    #[test]
    fn an_agents_report_of_its_own_model_is_shown_but_not_budgeted() {
        let meter = LlmMeter::default();
        let stop = CancellationToken::new();
        meter.arm(
            Budget {
                max_calls: Some(1),
                max_cost: Some(0.5),
            },
            stop.clone(),
        );
        for _ in 0..3 {
            meter.record_agent_turn(Some(5), Some(5), Some(0.6));
        }
        assert!(!stop.is_cancelled());
        assert_eq!(meter.by_role()["agent"].calls, 3);
        // A model under test the engine called counts, request by request: the one
        // admitted, and no second one.
        meter.record_model_request(None, 1, meter.admit().unwrap());
        assert!(stop.is_cancelled());
        assert!(
            meter.admit().is_err(),
            "a request past the budget is not sent"
        );
        assert_eq!(meter.by_role()["agent"].calls, 4);
    }
}
