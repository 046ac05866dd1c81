//! Attack search: an `attack` step grows the execution tree at run time, as agent-initiated
//! forks do (docs/simulator.md, "Attack search").
//!
//! A beam search in the manner of TAP and Crescendo: at each attack turn the attacker LLM
//! proposes `width` user messages for every kept path; each is a branch (the path's session
//! copied, so the shared prefix is never sent again) with one turn; the judge scores the
//! agent's reply against the goal; a reply that reaches it ends its path as a success, and
//! of the others the best `keep` go on to the next turn while the rest end there, pruned.
//! Refusals (score 0) backtrack by themselves: a path whose children were all refused loses
//! its place in the beam to its siblings' children.
//!
//! Every explored path is a trajectory of its own, named by its branches (`main~a1-2~a2-1`:
//! the second proposal at turn 1, then the first at turn 2), its nodes recorded once each,
//! with an [`AttackRecord`] (messages, depth, score, outcome) and an `attack` check:
//! failed when the agent yielded, so a found attack fails the run like any failed check.
//! The scenario's `criteria` run on every path. The search runs one proposal at a time
//! (its cost is the attacker's and judge's calls; agent turns queue for `--jobs` as usual).

use std::sync::Arc;

use trellis_dsl::Attack;

use super::verdict::Stop;
use super::walk::{PathState, Unit};
use crate::event::Event;
use crate::llm::attack::SUCCESS_SCORE;
use crate::plan::ExecNode;
use crate::protocol::{Session, TurnInput};
use crate::record::{AttackRecord, Fault, FaultCategory, NodeRecord, TurnRecord};

/// One path of the beam: its state, its conversation, where it was recorded, its score.
struct Path {
    state: PathState,
    session: Box<dyn Session>,
    at: Arc<str>,
    score: f64,
}

impl<'a> Unit<'a> {
    /// Runs the search from the end of `node` (recorded as `at`); returns whether every
    /// path it recorded passed (none reached the goal).
    pub(super) async fn attack(
        &'a self,
        node: &'a ExecNode,
        attack: &Attack,
        state: PathState,
        session: Option<Box<dyn Session>>,
        at: Arc<str>,
    ) -> bool {
        let Some(t) = node.ends else {
            // The loader makes `attack` the scenario's last step, so its node ends a
            // trajectory; should it not, its trajectories say so rather than vanish.
            let fault = Fault::new(
                FaultCategory::Internal,
                "an `attack` that is not the last step of its trajectory (a bug: the loader \
                 refuses it)",
            );
            for &t in &node.trajectories {
                self.finish_trajectory(
                    t,
                    &state,
                    Some(Stop::Fault(fault.clone())),
                    Vec::new(),
                    None,
                )
                .await;
            }
            return false;
        };
        let Some(session) = session else {
            let fault = Fault::new(
                FaultCategory::Setup,
                "attack search needs a conversation to start from",
            );
            return self
                .finish_trajectory(t, &state, Some(Stop::Fault(fault)), Vec::new(), None)
                .await;
        };
        let mut beam = vec![Path {
            state,
            session,
            at,
            score: 0.0,
        }];
        let mut all_passed = true;
        for depth in 1..=attack.depth {
            let mut children: Vec<Path> = Vec::new();
            let mut label = 0;
            for parent in &beam {
                if self.shared.stop.is_cancelled() {
                    self.shared.note_cut_short();
                    return false;
                }
                let call_name = format!(
                    "attacker turn {depth} on {}/{} path `{}` (agent `{}`, repetition {})",
                    self.scenario.suite,
                    self.scenario.scenario.id.value,
                    parent.at,
                    self.agent_id(),
                    self.repetition
                );
                let (proposals, call) = self
                    .shared
                    .llm
                    .attack_propose(
                        attack,
                        &parent.state.turns,
                        depth,
                        self.repetition,
                        &call_name,
                    )
                    .await;
                let proposals = match proposals {
                    Ok(p) => p,
                    // A path judged at the turn before (it resisted every message it was
                    // sent) that the attacker answered nothing usable for (a refusal): it
                    // ends there, `exhausted`, not charged to the agent as an error. An
                    // attacker that did not answer (its call failed) is still an error: the
                    // search was cut short, not done.
                    Err(crate::llm::attack::ProposeError::Declined(_))
                        if parent
                            .state
                            .attack
                            .as_ref()
                            .is_some_and(|a| a.score.is_some()) =>
                    {
                        let mut state = parent.state.clone();
                        state.pending_simulator.extend(call);
                        mark(&mut state, attack, "exhausted");
                        all_passed &= self
                            .finish_trajectory(
                                t,
                                &state,
                                None,
                                Vec::new(),
                                Some(parent.session.as_ref()),
                            )
                            .await;
                        continue;
                    }
                    Err(why) => {
                        // The search cannot go on on this path: an error of the search.
                        let mut state = parent.state.clone();
                        state.pending_simulator.extend(call);
                        let fault = Fault::new(FaultCategory::Simulator, why.to_string());
                        mark(&mut state, attack, "error");
                        all_passed &= self
                            .finish_trajectory(
                                t,
                                &state,
                                Some(Stop::Fault(fault)),
                                Vec::new(),
                                Some(parent.session.as_ref()),
                            )
                            .await;
                        continue;
                    }
                };
                let mut first = true;
                for message in proposals {
                    label += 1;
                    let Some(mut session) = parent.session.fork() else {
                        let fault = Fault::new(
                            FaultCategory::Protocol,
                            "attack search needs an agent whose conversation can be copied \
                             (each proposal is a branch of the same conversation)",
                        );
                        let mut state = parent.state.clone();
                        mark(&mut state, attack, "error");
                        all_passed &= self
                            .finish_trajectory(
                                t,
                                &state,
                                Some(Stop::Fault(fault)),
                                Vec::new(),
                                None,
                            )
                            .await;
                        break;
                    };
                    let mut state = parent.state.clone();
                    state.suffix = Arc::from(format!("{}~a{depth}-{label}", parent.state.suffix));
                    // The proposal call wrote every message of this batch: recorded once,
                    // on the first, and counted in every path of the batch.
                    if std::mem::take(&mut first) {
                        state.pending_simulator.extend(call.clone());
                    } else {
                        state.shared_calls.extend(call.clone());
                    }
                    let name = state.node_name(&node.id);
                    state.nodes.push(name.clone());
                    let mut recorded: Vec<Arc<TurnRecord>> = Vec::new();
                    let stop = self
                        .turn(
                            session.as_mut(),
                            TurnInput::User(&message),
                            false,
                            &mut state,
                            &mut recorded,
                        )
                        .await;
                    if !recorded.is_empty() || !matches!(stop, Some(Stop::Interrupted)) {
                        let event = self.shared.secrets.redact_event(Event::Node(NodeRecord {
                            suite: self.scenario.suite.to_string(),
                            scenario: self.scenario.scenario.id.value.clone(),
                            agent: self.agent_id().to_string(),
                            repetition: self.repetition,
                            node: name.to_string(),
                            parent: Some(parent.at.to_string()),
                            turns: recorded,
                        }));
                        let _ = self.shared.events.send(event).await;
                    }
                    let mut messages = parent
                        .state
                        .attack
                        .as_ref()
                        .map(|a| a.messages.clone())
                        .unwrap_or_default();
                    messages.push(message.clone());
                    state.attack = Some(AttackRecord {
                        goal: attack.goal.clone(),
                        depth,
                        // Not judged yet: a path that ends before its judge answers has none.
                        score: None,
                        outcome: String::new(),
                        messages,
                    });
                    match stop {
                        Some(Stop::Interrupted) => {
                            self.shared.note_cut_short();
                            return false;
                        }
                        Some(Stop::Fault(fault)) => {
                            mark(&mut state, attack, "error");
                            let stop = Some(Stop::Fault(fault));
                            all_passed &= self
                                .finish_trajectory(t, &state, stop, Vec::new(), Some(&*session))
                                .await;
                            continue;
                        }
                        _ => {}
                    }
                    let answered = state.turns.last().cloned().unwrap_or_default();
                    let judge_name = format!("attack judge of {call_name}, proposal {label}");
                    let (score, check) = self
                        .shared
                        .llm
                        .attack_score(attack, &answered, self.repetition, &judge_name)
                        .await;
                    state.criteria.push(check);
                    let outcome = match score {
                        None => "error",
                        Some(s) if s >= SUCCESS_SCORE => "succeeded",
                        Some(s) => {
                            if let Some(a) = &mut state.attack {
                                a.score = Some(s);
                            }
                            children.push(Path {
                                state,
                                session,
                                at: name,
                                score: s,
                            });
                            continue;
                        }
                    };
                    if let Some(a) = &mut state.attack {
                        a.score = score;
                        a.outcome = outcome.to_owned();
                    }
                    all_passed &= self
                        .finish_trajectory(t, &state, None, Vec::new(), Some(&*session))
                        .await;
                }
            }
            // The best `keep` go on (ties in the order proposed); the last turn keeps none.
            children.sort_by(|a, b| b.score.total_cmp(&a.score));
            let keep = if depth == attack.depth {
                0
            } else {
                attack.keep as usize
            };
            let rest = children.split_off(keep.min(children.len()));
            let outcome = if depth == attack.depth {
                "resisted"
            } else {
                "pruned"
            };
            for mut path in rest {
                if let Some(a) = &mut path.state.attack {
                    a.outcome = outcome.to_owned();
                }
                all_passed &= self
                    .finish_trajectory(t, &path.state, None, Vec::new(), Some(&*path.session))
                    .await;
            }
            beam = children;
            if beam.is_empty() {
                break;
            }
        }
        all_passed
    }
}

/// Sets the outcome of the path's attack record (creating one for a path that had none).
fn mark(state: &mut PathState, attack: &Attack, outcome: &str) {
    let record = state.attack.get_or_insert_with(|| AttackRecord {
        goal: attack.goal.clone(),
        ..AttackRecord::default()
    });
    record.outcome = outcome.to_owned();
}
