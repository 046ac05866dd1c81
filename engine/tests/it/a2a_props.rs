//! Property tests of the A2A codec: random and near-valid inputs never panic it, and
//! whatever it makes of them is either an answer or a fault.

use proptest::prelude::*;
use serde_json::{Value, json};
use trellis_engine::protocol::a2a::wire::{self, Assembly};

/// Arbitrary JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z_\\-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("kind".to_owned()),
                    Just("type".to_owned()),
                    Just("status".to_owned()),
                    Just("state".to_owned()),
                    Just("parts".to_owned()),
                    Just("artifact".to_owned()),
                    Just("artifactId".to_owned()),
                    Just("append".to_owned()),
                    Just("final".to_owned()),
                    Just("message".to_owned()),
                    Just("text".to_owned()),
                    Just("data".to_owned()),
                    Just("task".to_owned()),
                    "[a-z]{1,6}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Results close to valid ones: the right shapes with values swapped for random ones.
fn near_valid() -> impl Strategy<Value = Value> {
    let kinds = prop_oneof![
        Just("task"),
        Just("message"),
        Just("status-update"),
        Just("artifact-update"),
        Just("bogus"),
    ];
    let states = prop_oneof![
        Just("submitted"),
        Just("working"),
        Just("input-required"),
        Just("completed"),
        Just("failed"),
        Just("TASK_STATE_CANCELED"),
        Just("?"),
    ];
    (kinds, states, any_json(), any::<bool>(), any::<bool>()).prop_map(
        |(kind, state, noise, append, last)| {
            json!({"kind": kind, "id": "t", "taskId": "t", "contextId": "c", "append": append,
                "final": last, "status": {"state": state, "message": {"parts": [noise.clone()]}},
                "artifact": {"artifactId": "a", "parts": [noise.clone(), {"kind": "text", "text": "x"}]},
                "parts": [noise], "role": "agent"})
        },
    )
}

proptest! {
    #![proptest_config(crate::fuzz::config(256))]

    #[test]
    fn bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = wire::response_result(&body, 1);
        let _ = wire::parse_card(&body);
    }

    #[test]
    fn json_envelopes_never_panic(value in any_json()) {
        let _ = wire::response_result(value.to_string().as_bytes(), 1);
        let _ = wire::parse_card(value.to_string().as_bytes());
        let mut assembly = Assembly::new();
        let _ = assembly.apply(value);
        let _ = assembly.finish();
    }

    #[test]
    fn near_valid_results_give_an_answer_or_a_fault(results in prop::collection::vec(near_valid(), 1..8)) {
        let mut assembly = Assembly::new();
        for result in results {
            let envelope = json!({"jsonrpc": "2.0", "id": 1, "result": result});
            match wire::response_result(envelope.to_string().as_bytes(), 1) {
                Ok(result) => { let _ = assembly.apply(result); }
                Err(fault) => prop_assert!(!fault.message.is_empty()),
            }
        }
        let answer = assembly.finish();
        if let Some(fault) = answer.fault {
            prop_assert!(!fault.message.is_empty());
        }
    }
}
