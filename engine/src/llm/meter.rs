//! What a run spends on language models, per role, and the budget that stops it.
//!
//! Every LLM call of a run is counted once, where it is made, under its role: `simulator`
//! (the simulated user), `judge` (judged checks, panels' members, the fidelity judge),
//! `agent` (a model under test as its turns report it, Fixie's LLM) and `attacker`
//! (attack search). Counting at the source, not from trajectories, counts a shared prefix's
//! calls once however many branches continue it. A call's `calls` are the HTTP requests it
//! sent (a retry, the schema fallback's second ask, a 429's re-send and a refused
//! parameter's re-send each one more), and one for an answer from the cache: the same count
//! as the trajectories' `llm_calls` ([`LlmUsage::add`]) and what `--max-llm-calls` bounds.
//!
//! `--max-llm-calls` and `--max-llm-cost` ([`Budget`]) stop the run gracefully when reached:
//! the meter cancels the run's stop token, as Ctrl-C does, so no new call starts, calls in
//! flight finish and finished trajectories are recorded. Every HTTP request the engine sends
//! to a model is admitted before it is sent, through the [`Tab`] of its call
//! ([`Tab::admit`], in the call loop, `send.rs`), retries included:
//! - with `--max-llm-calls N`, requests sent and requests in flight together never pass N,
//!   however many trajectories ask at once (fifty simulated users starting together under
//!   `--max-llm-calls 1` sent fifty calls when the count was only taken as answers came back;
//!   retries went unbudgeted when calls were admitted once each);
//! - with `--max-llm-cost COST`, no request is sent once the cost spent reaches COST. A cost is
//!   known only once a request is answered, so each request in flight holds a reservation of
//!   what it may cost (its prompt at four bytes a token plus its output cap, 512 tokens when
//!   uncapped, at its provider's prices), and a request is sent while others are in flight
//!   only if the spent cost and the reservations, its own included, stay within COST; one
//!   that does not fit waits for those in flight to answer. A request is sent alone (no
//!   other request with a reservation in flight) whatever its reservation, so COST is passed by at most one request's cost, as long as requests
//!   cost no more than their reservations (thirty judges sent at once under `--max-llm-cost`
//!   all went out before the first answer said the budget was spent).
//!
//! Once the run stops (a signal, or the budget itself), a call that has sent nothing yet is
//! refused, including one waiting for room, which the stop wakes: the console promises that
//! no new call starts after Ctrl-C, and a waiting request was sent once those in flight had
//! answered. A call in flight (its retries, a model agent's next tool round) goes on.
//!
//! Cache hits send nothing and cost nothing: they count in the usage, not against the
//! budget. A model under test reached without a `provider` has no prices to reserve with: its
//! requests reserve nothing.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::Notify;
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
    /// HTTP requests sent to a provider (cache hits excluded).
    pub max_calls: Option<u64>,
    /// Cost in the providers' price unit (`input-price`/`output-price`).
    pub max_cost: Option<f64>,
}

#[derive(Default)]
struct Spent {
    roles: BTreeMap<Role, LlmUsage>,
    /// Requests sent and ended (answered, failed, or abandoned).
    sent: u64,
    /// Requests admitted and not yet ended.
    in_flight: u64,
    /// What the requests in flight may cost, by their reservations.
    reserved: f64,
    /// Of `in_flight`, those with a reservation (a priced provider's): only they may spend
    /// the cost budget.
    priced_in_flight: u64,
    /// Of `sent`, requests admitted and then abandoned unanswered (their trajectory cut off
    /// as the run stopped): counted as sent, since they may have reached the provider.
    abandoned: u64,
    cost: f64,
}

impl Spent {
    /// A request admitted with `reservation` has ended: counted as sent, its place and its
    /// reservation given back.
    fn end_request(&mut self, reservation: f64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if reservation > 0.0 {
            self.priced_in_flight = self.priced_in_flight.saturating_sub(1);
        }
        self.sent += 1;
        // Sums of floats drift: with nothing priced in flight nothing is reserved, exactly.
        self.reserved = if self.priced_in_flight == 0 {
            0.0
        } else {
            (self.reserved - reservation).max(0.0)
        };
    }
}

/// Which limit stopped the run; said with the counts at the run's end
/// ([`LlmMeter::tripped`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Trip {
    Calls(u64),
    Cost(f64),
}

/// What the budget says to a request about to be sent.
#[derive(Debug, PartialEq)]
enum Decision {
    Send,
    /// Not yet: what is in flight may spend the rest of `--max-llm-cost`.
    Wait,
    /// Not at all: a limit is reached (the reason, said on the call's record, and the
    /// limit, which stops the run).
    Refuse(String, Option<Trip>),
}

/// Whether a request that may cost `reservation` can be sent now under `budget`.
fn decide(spent: &Spent, budget: Budget, reservation: f64) -> Decision {
    if let Some(max) = budget.max_calls
        && spent.sent.saturating_add(spent.in_flight) >= max
    {
        // Requests in flight hold their place; said apart, as they may yet be abandoned
        // unsent (a judge the stopping run no longer waits for).
        let (sent, in_flight) = (spent.sent, spent.in_flight);
        let reason = if in_flight == 0 {
            format!("--max-llm-calls {max} reached ({sent} calls sent)")
        } else {
            format!("--max-llm-calls {max} reached ({sent} calls sent, {in_flight} in flight)")
        };
        return Decision::Refuse(reason, Some(Trip::Calls(max)));
    }
    if let Some(max) = budget.max_cost {
        if spent.cost >= max {
            let reason = format!("--max-llm-cost {max} reached (cost {:.4})", spent.cost);
            return Decision::Refuse(reason, Some(Trip::Cost(max)));
        }
        // Alone it goes whatever it may cost: waiting would never end, and refusing it
        // would leave a budget below one request's reservation unusable. Requests that
        // reserve nothing (a model under test without prices) cannot spend it: they do not
        // make it wait.
        if spent.priced_in_flight > 0 && spent.cost + spent.reserved + reservation > max {
            return Decision::Wait;
        }
    }
    Decision::Send
}

/// The run's LLM usage per role, and its budget once armed.
#[derive(Default)]
pub struct LlmMeter {
    spent: Mutex<Spent>,
    armed: OnceLock<(Budget, CancellationToken)>,
    /// Which limit stopped the run, once one did.
    tripped: OnceLock<Trip>,
    /// A request was refused: work the run did not do.
    refused: std::sync::atomic::AtomicBool,
    /// Told when a request ends or the budget trips: requests waiting for room under
    /// `--max-llm-cost` look again.
    changed: Notify,
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

    fn budget(&self) -> Budget {
        self.armed
            .get()
            .map(|(budget, _)| *budget)
            .unwrap_or_default()
    }

    /// Counts one call of `role` that sent nothing (answered from the cache, or failed
    /// before anything was sent).
    pub fn record(&self, role: Role, call: &LlmCall) {
        self.add(role, call, None, true);
    }

    /// A new call's tab: each of its requests is admitted through it ([`Tab::admit`]), and
    /// the call is counted with it ([`LlmMeter::record_admitted`]).
    pub fn tab(&self) -> Tab<'_> {
        Tab {
            meter: self,
            state: Mutex::new(TabState::default()),
        }
    }

    /// The tab of a request that continues a call already under way (a model agent's
    /// turn's next tool round): as [`LlmMeter::tab`], but the run's stop does not refuse
    /// it, since the call it belongs to is in flight and calls in flight finish.
    pub fn tab_continuing(&self) -> Tab<'_> {
        Tab {
            meter: self,
            state: Mutex::new(TabState {
                started: true,
                ..TabState::default()
            }),
        }
    }

    /// Counts a call whose requests `tab` admitted, now answered, failed or refused.
    pub fn record_admitted(&self, role: Role, call: &LlmCall, tab: Tab<'_>) {
        let held = tab
            .state
            .lock()
            .ok()
            .and_then(|mut state| state.holding.take());
        self.add(role, call, held, true);
    }

    /// Counts one request of a model API under test ([`crate::protocol::CallContext`]'s
    /// `llm_meter`), its HTTP requests admitted through `tab`, with the usage it reported.
    /// `refused`: the budget refused one of its requests.
    pub fn record_model_request(
        &self,
        usage: Option<crate::transport::Usage>,
        attempts: usize,
        refused: bool,
        tab: Tab<'_>,
    ) {
        let call = LlmCall {
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
            cost: usage.and_then(|u| u.cost),
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            refused,
            ..LlmCall::default()
        };
        self.record_admitted(Role::Agent, &call, tab);
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
        self.add(Role::Agent, &call, None, false);
    }

    /// `held`: the reservation of the call's last request, still in flight until now;
    /// `costed`: its cost counts against `--max-llm-cost`.
    fn add(&self, role: Role, call: &LlmCall, held: Option<f64>, costed: bool) {
        let (calls, cost) = {
            let Ok(mut spent) = self.spent.lock() else {
                return;
            };
            // A call that sent nothing and was no cache hit (refused, or failed before
            // sending) is no call: its role is not listed for it.
            if call.attempts > 0 || call.cache == CacheUse::Hit {
                spent.roles.entry(role).or_default().add(call);
            }
            if let Some(reservation) = held {
                spent.end_request(reservation);
            }
            if costed {
                // A priced request answered without usage (a server that reports none, a
                // stream without `include_usage`) spends what it reserved: counted as free,
                // it let a run past `--max-llm-cost` without a word.
                let unreported = held.filter(|_| call.attempts > 0 && call.cache != CacheUse::Hit);
                spent.cost += call.cost.or(unreported).unwrap_or(0.0);
            }
            (spent.sent, spent.cost)
        };
        if held.is_some() {
            self.changed.notify_waiters();
        }
        let budget = self.budget();
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
            // Requests waiting for room are refused now.
            self.changed.notify_waiters();
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

    /// Whether a request was refused: a check, a simulated turn or an attack step the run
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

/// One call's requests under the budget ([`LlmMeter::tab`]). A call's requests go one
/// after another, so it has at most one in flight.
pub struct Tab<'a> {
    meter: &'a LlmMeter,
    state: Mutex<TabState>,
}

#[derive(Default)]
struct TabState {
    /// The reservation of the request in flight, once one was admitted.
    holding: Option<f64>,
    /// The call has sent a request (or continues one that did): it is in flight, and its
    /// next requests (retries) are not refused for the run's stop.
    started: bool,
}

impl Tab<'_> {
    /// Lets the call's next HTTP request be sent, `reservation` being the most it is
    /// expected to cost: at once, after the requests in flight have answered when they may
    /// spend what is left of `--max-llm-cost`, or never (`Err`, why) when a limit is
    /// reached, which stops the run. The call's request before this one has ended by now.
    ///
    /// The run's stop (a signal's, or the budget's own) refuses a call that has not sent
    /// anything yet, waiting or not: no new call starts once the run stops. A call already
    /// in flight goes on (its retries wait for room as before), as calls in flight finish.
    pub async fn admit(&self, reservation: f64) -> Result<(), String> {
        let stop = self.meter.armed.get().map(|(_, stop)| stop);
        loop {
            // Registered before looking, so a request ending in between is not missed.
            let mut changed = std::pin::pin!(self.meter.changed.notified());
            changed.as_mut().enable();
            match self.try_admit(reservation) {
                Decision::Send => return Ok(()),
                Decision::Refuse(reason, _) => return Err(format!("not sent: {reason}")),
                Decision::Wait => match stop {
                    // Nothing else wakes it at a signal: requests in flight may take long
                    // to end, and it would be sent once they had, after the stop. (A call
                    // in flight does not watch the stop: it would wake at once, again and
                    // again, the stop being for good.)
                    Some(stop) if !self.started() => tokio::select! {
                        () = changed => {}
                        () = stop.cancelled() => {}
                    },
                    _ => changed.await,
                },
            }
        }
    }

    fn started(&self) -> bool {
        self.state.lock().map(|state| state.started).unwrap_or(true)
    }

    fn try_admit(&self, reservation: f64) -> Decision {
        let meter = self.meter;
        let budget = meter.budget();
        let (decision, ended) = {
            let (Ok(mut state), Ok(mut spent)) = (self.state.lock(), meter.spent.lock()) else {
                return Decision::Refuse("the LLM meter is unavailable".to_owned(), None);
            };
            let ended = state.holding.take();
            if let Some(reservation) = ended {
                spent.end_request(reservation);
            }
            let mut decision = decide(&spent, budget, reservation);
            // Stopped (Ctrl-C, SIGTERM): the console promises no new call starts. A stop
            // at the budget refuses with its own reason, in `decide`.
            let stopping = meter
                .armed
                .get()
                .is_some_and(|(_, stop)| stop.is_cancelled());
            if stopping && !state.started && !matches!(decision, Decision::Refuse(..)) {
                decision = Decision::Refuse("the run is stopping".to_owned(), None);
            }
            if decision == Decision::Send {
                spent.in_flight += 1;
                if reservation > 0.0 {
                    spent.priced_in_flight += 1;
                }
                spent.reserved += reservation;
                state.holding = Some(reservation);
                state.started = true;
            }
            (decision, ended.is_some())
        };
        if ended {
            meter.changed.notify_waiters();
        }
        if let Decision::Refuse(_, trip) = &decision {
            meter
                .refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(trip) = trip {
                meter.trip(*trip);
            }
        }
        decision
    }
}

impl Drop for Tab<'_> {
    /// A request abandoned in flight (its trajectory cut off) may well have reached the
    /// provider: it stays counted as sent.
    fn drop(&mut self) {
        let held = self
            .state
            .get_mut()
            .ok()
            .and_then(|state| state.holding.take());
        if let Some(reservation) = held {
            if let Ok(mut spent) = self.meter.spent.lock() {
                spent.end_request(reservation);
                spent.abandoned += 1;
            }
            self.meter.changed.notify_waiters();
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

    fn armed(max_calls: Option<u64>, max_cost: Option<f64>) -> (LlmMeter, CancellationToken) {
        let meter = LlmMeter::default();
        let stop = CancellationToken::new();
        meter.arm(
            Budget {
                max_calls,
                max_cost,
            },
            stop.clone(),
        );
        (meter, stop)
    }

    /// A call of one request costing `cost`, sent and answered.
    async fn one(meter: &LlmMeter, role: Role, cost: f64) {
        let tab = meter.tab();
        tab.admit(cost).await.unwrap();
        meter.record_admitted(role, &call(cost, CacheUse::Miss), tab);
    }

    #[tokio::test]
    async fn roles_are_counted_apart_and_the_call_budget_stops_the_run_once() {
        let (meter, stop) = armed(Some(2), None);
        one(&meter, Role::Simulator, 0.5).await;
        // A cache hit sends nothing: not against the budget.
        meter.record(Role::Judge, &call(0.0, CacheUse::Hit));
        assert!(!stop.is_cancelled());
        one(&meter, Role::Judge, 0.5).await;
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

    #[tokio::test]
    async fn the_cost_budget_counts_every_role() {
        let (meter, stop) = armed(None, Some(1.0));
        let usage = crate::transport::Usage {
            prompt_tokens: Some(5),
            completion_tokens: Some(5),
            total_tokens: None,
            cost: Some(0.6),
            priced_prompt_tokens: None,
        };
        let tab = meter.tab();
        tab.admit(0.6).await.unwrap();
        meter.record_model_request(Some(usage), 1, false, tab);
        assert!(!stop.is_cancelled());
        one(&meter, Role::Simulator, 0.4).await;
        assert!(stop.is_cancelled());
        assert!(
            meter
                .tripped()
                .is_some_and(|r| r.starts_with("--max-llm-cost 1"))
        );
        // Spent: nothing more is sent.
        let refused = meter.tab().admit(0.0).await.err().unwrap();
        assert!(
            refused.starts_with("not sent: --max-llm-cost 1 reached"),
            "{refused}"
        );
    }

    /// A priced request answered without usage spends what it reserved: a server that
    /// reports no tokens does not make every request free under `--max-llm-cost`.
    #[tokio::test]
    async fn a_request_answered_without_usage_spends_its_reservation() {
        let (meter, stop) = armed(None, Some(1.0));
        for _ in 0..2 {
            let tab = meter.tab();
            tab.admit(0.6).await.unwrap();
            meter.record_model_request(None, 1, false, tab);
        }
        assert!(
            stop.is_cancelled(),
            "two requests reserving 0.6 each spent nothing"
        );
        // Its cost stays unknown where usage is shown.
        assert_eq!(meter.by_role()["agent"].cost, None);
    }

    #[tokio::test]
    async fn requests_in_flight_hold_their_place_under_the_call_budget() {
        let (meter, stop) = armed(Some(2), None);
        // Two requests admitted at once, neither answered yet: a third is not sent.
        let (first, second) = (meter.tab(), meter.tab());
        first.admit(0.0).await.unwrap();
        second.admit(0.0).await.unwrap();
        let refused = meter.tab().admit(0.0).await.err().unwrap();
        assert_eq!(
            refused,
            "not sent: --max-llm-calls 2 reached (0 calls sent, 2 in flight)"
        );
        assert!(stop.is_cancelled(), "the refusal stops the run");
        assert!(
            meter.refused_any(),
            "a refused request is work the run did not do"
        );
        meter.record_admitted(Role::Simulator, &call(0.1, CacheUse::Miss), first);
        // A request abandoned in flight may have reached the provider: it stays counted,
        // and the end says which were answered.
        drop(second);
        assert!(meter.tab().admit(0.0).await.is_err());
        assert_eq!(meter.by_role()["simulator"].calls, 1);
        assert_eq!(
            meter.tripped().as_deref(),
            Some(
                "--max-llm-calls 2 reached (1 answered, 1 abandoned unanswered as the run \
                 stopped)"
            )
        );

        // Without a budget every request is admitted.
        let free = LlmMeter::default();
        let tabs: Vec<_> = (0..100).map(|_| free.tab()).collect();
        for tab in &tabs {
            tab.admit(1.0).await.unwrap();
        }
    }

    #[tokio::test]
    async fn every_retry_is_a_request_against_the_call_budget() {
        let (meter, stop) = armed(Some(3), None);
        // A call retried twice: three requests, the budget's three.
        let tab = meter.tab();
        for _ in 0..3 {
            tab.admit(0.0).await.unwrap();
        }
        assert!(!stop.is_cancelled());
        // The fourth request, a retry of the same call, is refused and stops the run.
        let refused = tab.admit(0.0).await.err().unwrap();
        assert_eq!(
            refused,
            "not sent: --max-llm-calls 3 reached (3 calls sent)"
        );
        assert!(stop.is_cancelled());
        let record = LlmCall {
            attempts: 3,
            refused: true,
            ..LlmCall::default()
        };
        meter.record_admitted(Role::Judge, &record, tab);
        assert_eq!(meter.by_role()["judge"].calls, 3);
        assert_eq!(
            meter.tripped().as_deref(),
            Some("--max-llm-calls 3 reached (3 calls sent)")
        );
        // A call refused before it sent anything is no call of its role.
        let (meter, _) = armed(Some(1), None);
        one(&meter, Role::Judge, 0.0).await;
        let tab = meter.tab();
        assert!(tab.admit(0.0).await.is_err());
        let record = LlmCall {
            refused: true,
            ..LlmCall::default()
        };
        meter.record_admitted(Role::Simulator, &record, tab);
        assert!(!meter.by_role().contains_key("simulator"));
    }

    #[tokio::test]
    async fn the_cost_budget_holds_requests_while_those_in_flight_may_spend_it() {
        let (meter, stop) = armed(None, Some(10.0));
        // Reservations of 4 each: two fit under 10 together, a third waits.
        let (a, b, c) = (meter.tab(), meter.tab(), meter.tab());
        a.admit(4.0).await.unwrap();
        b.admit(4.0).await.unwrap();
        {
            let mut waiting = std::pin::pin!(c.admit(4.0));
            assert!(
                futures::poll!(waiting.as_mut()).is_pending(),
                "sent while those in flight may spend the rest"
            );
            // One answers at 2: 2 spent + 4 reserved + 4 fits.
            meter.record_admitted(Role::Judge, &call(2.0, CacheUse::Miss), a);
            assert!(futures::poll!(waiting.as_mut()).is_ready());
        }
        // Both answer dear: 2 + 5 + 5 = 12, the limit passed by less than one request.
        meter.record_admitted(Role::Judge, &call(5.0, CacheUse::Miss), b);
        assert!(!stop.is_cancelled());
        meter.record_admitted(Role::Judge, &call(5.0, CacheUse::Miss), c);
        assert!(stop.is_cancelled());
        assert!(meter.tab().admit(0.0).await.is_err());

        // A request waiting for room is refused when the budget trips meanwhile.
        let (meter, _) = armed(None, Some(5.0));
        let (a, b) = (meter.tab(), meter.tab());
        a.admit(4.0).await.unwrap();
        let mut waiting = std::pin::pin!(b.admit(4.0));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        meter.record_admitted(Role::Judge, &call(6.0, CacheUse::Miss), a);
        match futures::poll!(waiting.as_mut()) {
            std::task::Poll::Ready(Err(reason)) => {
                assert_eq!(reason, "not sent: --max-llm-cost 5 reached (cost 6.0000)");
            }
            other => panic!("{other:?}"),
        }

        // Requests that reserve nothing (unpriced) in flight do not hold back one that may
        // cost more than the budget: they cannot spend it, so it is as alone.
        let (meter, _) = armed(None, Some(5.0));
        let (a, b) = (meter.tab(), meter.tab());
        a.admit(0.0).await.unwrap();
        assert!(
            futures::poll!(std::pin::pin!(b.admit(10.0))).is_ready(),
            "an unpriced request in flight held back a priced one"
        );

        // Alone, a request goes whatever its reservation: the limit is passed by one.
        let (meter, stop) = armed(None, Some(5.0));
        one(&meter, Role::Judge, 10.0).await;
        assert!(stop.is_cancelled());
        assert!(meter.tab().admit(0.0).await.is_err());
    }

    /// Ctrl-C while a request waited for cost room: once the requests in flight ended it
    /// was sent, seconds after the stop, though the console had said no new call starts.
    #[tokio::test]
    async fn the_runs_stop_refuses_a_request_waiting_for_room_and_any_new_call() {
        let (meter, stop) = armed(None, Some(5.0));
        let (a, b) = (meter.tab(), meter.tab());
        a.admit(4.0).await.unwrap();
        {
            let mut waiting = std::pin::pin!(b.admit(4.0));
            assert!(futures::poll!(waiting.as_mut()).is_pending());
            // A signal: nothing in flight has ended, nothing was spent.
            stop.cancel();
            match futures::poll!(waiting.as_mut()) {
                std::task::Poll::Ready(Err(reason)) => {
                    assert_eq!(reason, "not sent: the run is stopping");
                }
                other => panic!("still waiting after the stop: {other:?}"),
            }
        }
        // A call not started yet is refused, room or not; the budget did not stop the run.
        assert_eq!(
            meter.tab().admit(0.0).await,
            Err("not sent: the run is stopping".to_owned())
        );
        assert_eq!(meter.tripped(), None);
        // The call in flight goes on: its retry is admitted once there is room, as is a
        // model agent's next tool round.
        assert!(a.admit(4.0).await.is_ok());
        assert!(meter.tab_continuing().admit(0.5).await.is_ok());
        meter.record_admitted(Role::Judge, &call(1.0, CacheUse::Miss), a);
    }

    #[tokio::test]
    async fn an_agents_report_of_its_own_model_is_shown_but_not_budgeted() {
        let (meter, stop) = armed(Some(1), Some(0.5));
        for _ in 0..3 {
            meter.record_agent_turn(Some(5), Some(5), Some(0.6));
        }
        assert!(!stop.is_cancelled());
        assert_eq!(meter.by_role()["agent"].calls, 3);
        // A model under test the engine called counts, request by request: the one
        // admitted, and no second one.
        let tab = meter.tab();
        tab.admit(0.0).await.unwrap();
        meter.record_model_request(None, 1, false, tab);
        assert!(stop.is_cancelled());
        assert!(
            meter.tab().admit(0.0).await.is_err(),
            "a request past the budget is not sent"
        );
        assert_eq!(meter.by_role()["agent"].calls, 4);
    }
}
