//! The fuzzer's inputs in the normal test suite: every seed (`fuzz/seeds/<target>/`) and every input that
//! once made a target panic (`fuzz/regressions/<target>/`) goes through the same code as the fuzz target
//! (`fuzz/harness.rs`), so a fixed crash stays fixed without running the fuzzer (`scripts/fuzz`, see
//! docs/fuzzing.md). The seeds are made from `schemas/examples`, the invalid fixtures and the deployed
//! configuration files; a test checks that the committed ones are current (`UPDATE_SEEDS=1` rewrites them).

#[allow(
    dead_code,
    reason = "the harness is shared with the fuzz targets, each of which uses one function"
)]
#[path = "../fuzz/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use volcano_runner::broker::properties;
use volcano_runner::messages::{self, Format, MessageType};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files of a directory, by name (none when it does not exist).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&p).expect("readable"))
        })
        .collect()
}

/// The files of `dir` whose names start with `prefix` and end with `suffix`, by stem.
fn sources(dir: &str, prefix: &str, suffix: &str) -> Vec<(String, Vec<u8>)> {
    files(&root().join(dir))
        .into_iter()
        .filter(|(name, _)| name.starts_with(prefix) && name.ends_with(suffix))
        .map(|(name, bytes)| (name.trim_end_matches(suffix).to_owned(), bytes))
        .collect()
}

/// The AMQP content header property list (AMQP 0-9-1, basic class): a flag word, then the properties
/// that are present, in order. Only those a publisher of jobs sets: content type, headers (a traceparent
/// and a quorum queue's delivery count), delivery mode, message id, timestamp and type.
fn amqp_properties(content_type: &str, type_name: &str, message_id: &str) -> Vec<u8> {
    fn short(out: &mut Vec<u8>, s: &str) {
        out.push(u8::try_from(s.len()).expect("a short string"));
        out.extend_from_slice(s.as_bytes());
    }
    let mut table = Vec::new();
    short(&mut table, "traceparent");
    table.push(b'S');
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    table.extend_from_slice(&u32::try_from(traceparent.len()).unwrap().to_be_bytes());
    table.extend_from_slice(traceparent.as_bytes());
    short(&mut table, "x-delivery-count");
    table.push(b'l');
    table.extend_from_slice(&2i64.to_be_bytes());

    // content-type 15, headers 13, delivery-mode 12, message-id 7, timestamp 6, type 5.
    let flags: u16 = 1 << 15 | 1 << 13 | 1 << 12 | 1 << 7 | 1 << 6 | 1 << 5;
    let mut out = flags.to_be_bytes().to_vec();
    short(&mut out, content_type);
    out.extend_from_slice(&u32::try_from(table.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&table);
    out.push(2);
    short(&mut out, message_id);
    out.extend_from_slice(&1_767_225_600u64.to_be_bytes());
    short(&mut out, type_name);
    out
}

/// The seed corpus of every target, by target and file name.
fn seeds() -> BTreeMap<&'static str, BTreeMap<String, Vec<u8>>> {
    let mut seeds: BTreeMap<&str, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    let mut add = |target: &'static str, name: String, bytes: Vec<u8>| {
        seeds.entry(target).or_default().insert(name, bytes);
    };
    let prefixed = |first: u8, body: &[u8]| [&[first][..], body].concat();

    // Inbound messages: the examples in both encodings, the invalid fixtures as sent (JSON).
    for (file_prefix, message_type, target, selector) in [
        ("submit-job", MessageType::SubmitJob, "submit_job", 0),
        ("cancel-job", MessageType::CancelJob, "control_message", 0),
        ("extend-job", MessageType::ExtendJob, "control_message", 2),
    ] {
        for (stem, json) in sources("schemas/examples", file_prefix, ".json") {
            let message = messages::decode_any(message_type, Format::Json, &json)
                .unwrap_or_else(|e| panic!("{stem}: {e}"));
            let protobuf = message.encode(Format::Protobuf).expect("encodes");
            add(target, format!("{stem}.json"), prefixed(selector, &json));
            add(
                target,
                format!("{stem}.pb"),
                prefixed(selector | 1, &protobuf),
            );
            for (format, body) in [(Format::Json, json), (Format::Protobuf, protobuf)] {
                let mut delivery = amqp_properties(
                    format.content_type(),
                    message_type.amqp_type(),
                    &format!("{stem}.1"),
                );
                delivery.extend_from_slice(&body);
                let extension = if format == Format::Json { "json" } else { "pb" };
                add("amqp_delivery", format!("{stem}.{extension}"), delivery);
            }
        }
        for (stem, json) in sources("tests/fixtures/invalid", file_prefix, ".json") {
            add(
                target,
                format!("invalid.{stem}.json"),
                prefixed(selector, &json),
            );
        }
    }

    for (name, value) in [
        (
            "w3c-example",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        (
            "future-version",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more",
        ),
        (
            "forbidden-version",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        (
            "zero-trace",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ),
    ] {
        add("traceparent", name.to_owned(), value.as_bytes().to_vec());
    }

    for (dir, prefix) in [
        ("deploy", "config.example"),
        ("deploy/config.d", ""),
        ("tests/fixtures", "config"),
        ("tests/golden/config", ""),
    ] {
        for (stem, text) in sources(dir, prefix, ".toml") {
            let name = format!("{}.{stem}.toml", dir.replace('/', "."));
            add("config_toml", name, text);
        }
    }
    add(
        "config_toml",
        "env-overrides".to_owned(),
        b"[limits]\nmax_replicas = 4\n\0VOLCANO_RUNNER_LIMITS__MAX_REPLICAS=8\n\
          VOLCANO_RUNNER_SIM__DEFAULT_RUN=90s\nVOLCANO_RUNNER_BROKER__PASSIVE=true\n"
            .to_vec(),
    );

    for (name, text) in [
        (
            "equality",
            "app=x,tier!=db\n{\"metadata\":{\"labels\":{\"app\":\"x\"}}}",
        ),
        (
            "sets",
            "env in (a,b),team notin (c),release,!canary\n{\"metadata\":{\"labels\":{\"env\":\"a\",\"release\":\"1\"}}}",
        ),
        (
            "compare",
            "rank>3,rank<10\n{\"metadata\":{\"labels\":{\"rank\":\"5\"}}}",
        ),
        (
            "fields",
            "metadata.name=p,status.phase!=Running\n{\"metadata\":{\"name\":\"p\"},\"status\":{\"phase\":\"Pending\"}}",
        ),
        (
            "structured",
            "\n{\"matchLabels\":{\"app\":\"x\"},\"matchExpressions\":[{\"key\":\"env\",\"operator\":\"In\",\"values\":[\"a\"]}]}",
        ),
    ] {
        add("sim_selector", name.to_owned(), text.as_bytes().to_vec());
    }

    for (name, text) in [
        (
            "merge",
            "{\"a\":{\"b\":1,\"c\":[1,2]}}\n{\"a\":{\"b\":null,\"d\":true}}",
        ),
        (
            "json-patch",
            "{\"a\":[1,2]}\n[{\"op\":\"test\",\"path\":\"/a/0\",\"value\":1},{\"op\":\"add\",\"path\":\"/a/-\",\"value\":3},{\"op\":\"remove\",\"path\":\"/a/0\"}]",
        ),
        (
            "strategic",
            "{\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"a\",\"env\":[{\"name\":\"X\",\"value\":\"1\"}]}]}}\n{\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"b\",\"env\":[{\"name\":\"Y\",\"value\":\"2\"}]},{\"name\":\"d\",\"$patch\":\"delete\"}]}}",
        ),
    ] {
        add("sim_patch", name.to_owned(), text.as_bytes().to_vec());
    }

    for (name, text) in [
        ("version", "GET /version"),
        (
            "discovery",
            "GET /apis\naccept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ),
        (
            "list-pods",
            "GET /api/v1/namespaces/fuzz/pods?labelSelector=app%3Dx&fieldSelector=metadata.name%3Dp&limit=1",
        ),
        (
            "watch-pods",
            "GET /api/v1/pods?watch=true&resourceVersion=1&allowWatchBookmarks=true",
        ),
        ("get-pod", "GET /api/v1/namespaces/fuzz/pods/p"),
        (
            "pod-log",
            "GET /api/v1/namespaces/fuzz/pods/p/log?container=c&timestamps=true&sinceSeconds=60&tailLines=5",
        ),
        (
            "pod-log-since-time",
            "GET /api/v1/namespaces/fuzz/pods/p/log?sinceTime=2025-12-31T23:00:00Z&follow=true",
        ),
        (
            "create-configmap",
            "POST /api/v1/namespaces/fuzz/configmaps?fieldManager=fuzz&fieldValidation=Strict\ncontent-type: application/json\n\n{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"c\"},\"data\":{\"a\":\"b\"}}",
        ),
        (
            "create-yaml",
            "POST /api/v1/namespaces/fuzz/configmaps\ncontent-type: application/yaml\n\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\n",
        ),
        (
            "merge-patch",
            "PATCH /api/v1/namespaces/fuzz/pods/p\ncontent-type: application/merge-patch+json\n\n{\"metadata\":{\"labels\":{\"b\":\"c\"}}}",
        ),
        (
            "json-patch",
            "PATCH /api/v1/namespaces/fuzz/pods/p\ncontent-type: application/json-patch+json\n\n[{\"op\":\"add\",\"path\":\"/metadata/annotations\",\"value\":{\"a\":\"b\"}}]",
        ),
        (
            "strategic-patch",
            "PATCH /api/v1/namespaces/fuzz/pods/p\ncontent-type: application/strategic-merge-patch+json\n\n{\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"other\"}]}}",
        ),
        (
            "apply-patch",
            "PATCH /api/v1/namespaces/fuzz/configmaps/a?fieldManager=fuzz&force=true\ncontent-type: application/apply-patch+yaml\n\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n",
        ),
        (
            "status-patch",
            "PATCH /api/v1/namespaces/fuzz/pods/p/status\ncontent-type: application/merge-patch+json\n\n{\"status\":{\"phase\":\"Running\"}}",
        ),
        (
            "delete-options",
            "DELETE /api/v1/namespaces/fuzz/pods/p?gracePeriodSeconds=0\ncontent-type: application/json\n\n{\"propagationPolicy\":\"Foreground\",\"preconditions\":{\"uid\":\"x\"},\"dryRun\":[\"All\"]}",
        ),
        (
            "delete-collection",
            "DELETE /api/v1/namespaces/fuzz/pods?labelSelector=app%3Dx&propagationPolicy=Background",
        ),
        (
            "vcjob-list",
            "GET /apis/batch.volcano.sh/v1alpha1/namespaces/fuzz/jobs?limit=5&continue=abc",
        ),
        (
            "eviction",
            "POST /api/v1/namespaces/fuzz/pods/p/eviction\ncontent-type: application/json\n\n{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{\"name\":\"p\",\"namespace\":\"fuzz\"}}",
        ),
    ] {
        add("sim_request", name.to_owned(), text.as_bytes().to_vec());
    }
    seeds
}

#[test]
fn committed_seeds_are_made_from_the_current_examples() {
    let dir = root().join("fuzz/seeds");
    let seeds = seeds();
    assert_eq!(
        seeds.keys().copied().collect::<Vec<_>>(),
        {
            let mut names: Vec<_> = harness::TARGETS.iter().map(|(n, _)| *n).collect();
            names.sort_unstable();
            names
        },
        "every target has seeds"
    );
    if std::env::var_os("UPDATE_SEEDS").is_some() {
        for (target, files) in &seeds {
            let target_dir = dir.join(target);
            let _ = fs::remove_dir_all(&target_dir);
            fs::create_dir_all(&target_dir).unwrap();
            for (name, bytes) in files {
                fs::write(target_dir.join(name), bytes).unwrap();
            }
        }
    }
    for (target, expected) in &seeds {
        let committed = files(&dir.join(target));
        assert!(
            committed == *expected,
            "fuzz/seeds/{target} differs from what the examples make: run \
             `UPDATE_SEEDS=1 cargo test --test fuzz_inputs` and commit the result"
        );
    }
}

#[test]
fn the_amqp_seeds_are_read_as_a_publisher_meant_them() {
    let mut bytes = amqp_properties("application/json", "volcano_runner.v1.CancelJob", "4818.1");
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
    let mut ran = 0;
    for (target, run) in harness::TARGETS {
        for kind in ["seeds", "regressions"] {
            for (name, bytes) in files(&root().join("fuzz").join(kind).join(target)) {
                let outcome = std::panic::catch_unwind(|| run(&bytes));
                assert!(outcome.is_ok(), "fuzz/{kind}/{target}/{name} panics");
                ran += 1;
            }
        }
    }
    assert!(ran >= seeds().values().map(BTreeMap::len).sum::<usize>());
}
