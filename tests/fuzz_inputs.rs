//! The fuzzer's inputs in the normal test suite: every seed (made from `schemas/examples`, the invalid
//! fixtures and the configuration files, as `scripts/fuzz` writes them for the fuzzer) and every input that
//! once made a target panic (`fuzz/regressions/<target>/`) goes through the same code as the fuzz target
//! (`fuzz/harness.rs`), so a fixed crash stays fixed without running the fuzzer (see docs/fuzzing.md).

#[allow(
    dead_code,
    reason = "the harness is shared with the fuzz targets, each of which uses one function"
)]
#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::PathBuf;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use volcano_runner::broker::properties;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_target_has_seeds_from_the_repository() {
    let seeds = harness::seeds(&root());
    let mut targets: Vec<_> = harness::TARGETS.iter().map(|(name, _)| *name).collect();
    targets.sort_unstable();
    assert_eq!(seeds.keys().copied().collect::<Vec<_>>(), targets);
    // Each inbound example in both encodings, and as a delivery.
    let examples = harness::files(&root().join("schemas/examples"));
    let inbound = examples
        .keys()
        .filter(|name| {
            ["submit-job", "cancel-job", "extend-job"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .count();
    assert!(inbound >= 3, "{examples:?}");
    assert_eq!(seeds["amqp_delivery"].len(), 2 * inbound);
    assert!(seeds["submit_job"].contains_key("submit-job.figlet.pb"));
    assert!(seeds["config_toml"].contains_key("deploy.config.example.toml"));
}

#[test]
fn the_amqp_seeds_are_read_as_a_publisher_meant_them() {
    let mut bytes =
        harness::amqp_properties("application/json", "volcano_runner.v1.CancelJob", "4818.1");
    bytes.extend_from_slice(b"{}");
    let (body, props) = lapin::protocol::basic::parse_properties(&bytes[..]).expect("parses");
    assert_eq!(body, b"{}");
    assert_eq!(
        props.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        props.kind().as_ref().map(|s| s.as_str()),
        Some("volcano_runner.v1.CancelJob")
    );
    assert_eq!(*props.timestamp(), Some(1_767_225_600));
    assert_eq!(properties::delivery_count(&props), Some(2));
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("traceparent"),
        AMQPValue::LongString(LongString::from(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )),
    );
    headers.insert(
        ShortString::from("x-delivery-count"),
        AMQPValue::LongLongInt(2),
    );
    let expected = BasicProperties::default().with_headers(headers);
    assert_eq!(props.headers(), expected.headers());
}

#[test]
fn every_seed_and_every_input_that_once_crashed_runs_without_a_panic() {
    let seeds = harness::seeds(&root());
    for (target, run) in harness::TARGETS {
        let regressions = harness::files(&root().join("fuzz/regressions").join(target));
        let inputs = seeds[target]
            .iter()
            .map(|(name, bytes)| (format!("seed {name}"), bytes))
            .chain(
                regressions
                    .iter()
                    .map(|(name, bytes)| (format!("fuzz/regressions/{target}/{name}"), bytes)),
            );
        for (name, bytes) in inputs {
            let outcome = std::panic::catch_unwind(|| run(bytes));
            assert!(outcome.is_ok(), "{target}: {name} panics");
        }
    }
}

/// The AMQP targets on mutations of their seeds and regression inputs (bytes flipped, set to bytes that
/// are not UTF-8, inserted, removed; lengths disturbed), without coverage guidance: a quick check in the
/// suite that the sanitizer's properties hold beyond the seeds. `AMQP_MUTATIONS` sets how many per
/// target (default 5,000), for a longer run where `scripts/fuzz` cannot build.
#[test]
fn mutated_amqp_inputs_keep_the_sanitizers_properties() {
    let count: usize = std::env::var("AMQP_MUTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5_000);
    let seeds = harness::seeds(&root());
    for (target, run) in harness::TARGETS {
        if !target.starts_with("amqp_") {
            continue;
        }
        let mut inputs: Vec<Vec<u8>> = seeds[target].values().cloned().collect();
        inputs.extend(harness::files(&root().join("fuzz/regressions").join(target)).into_values());
        let mut rng = fastrand::Rng::with_seed(41);
        for i in 0..count {
            let mut input = inputs[rng.usize(..inputs.len())].clone();
            for _ in 0..rng.usize(1..6) {
                if input.len() < 2 {
                    break;
                }
                // Keep the first byte (it picks the mode) most of the time.
                let at = rng.usize(1..input.len());
                match rng.u8(..6) {
                    0 => input[at] = rng.u8(..),
                    1 => input[at] = rng.u8(0x80..),
                    2 => input.insert(at, rng.u8(..)),
                    3 => {
                        input.remove(at);
                    }
                    4 => input[at] = input[at].wrapping_add(rng.u8(1..4)),
                    _ => input[0] = rng.u8(..),
                }
            }
            let outcome = std::panic::catch_unwind(|| run(&input));
            assert!(outcome.is_ok(), "{target}: mutation {i} panics: {input:?}");
        }
    }
}
