//! What each fuzz target does with one input, shared by the fuzz targets (`fuzz/fuzz_targets/*.rs`, built
//! with coverage instrumentation by `scripts/fuzz`) and by the main crate's test `tests/fuzz_inputs.rs`,
//! which runs every seed and every input that once crashed through the same code in the normal suite.
//!
//! A target panics only when the code under test does (or when a property stated here fails): bad input
//! must come back as an error value.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use futures::FutureExt;
use http::{Method, Request};
use http_body_util::BodyExt;
use lapin::types::FieldTable;
use serde_json::Value;
use tower::ServiceExt;
use volcano_runner::broker::OutboundEvent;
use volcano_runner::broker::sanitize::{self, Repair, Sanitizer, encode};
use volcano_runner::broker::{consumer, properties};
use volcano_runner::config::Config;
use volcano_runner::durable::ids;
use volcano_runner::messages::v1::{OpenSession, ProxyEvent};
use volcano_runner::messages::{self, AnyMessage, Format, Inbound, MessageType, v1::SubmitJob};
use volcano_runner::ops::TraceContext;
use volcano_runner::ops::trace::{TraceParent, annotation_key};
use volcano_runner::proxy::caddy::{self, CaddySettings};
use volcano_runner::proxy::envoy::{self, EnvoySettings};
use volcano_runner::proxy::{Applied, HostNaming, JobUpdate, RouteTable, Routes};
use volcano_runner::sessions::Kind;
use volcano_runner::sessions::authz::{Authz, Sessions};
use volcano_runner::sessions::record::{SessionRecord, name_for};
use volcano_runner::sessions::server::{self as authz_server, Answering};
use volcano_runner::sessions::token::Hash;
use volcano_runner::sim::patch;
use volcano_runner::sim::selector::{FieldSelector, LabelSelector};
use volcano_runner::sim::{SimConfig, Simulator};
use volcano_runner::{pipeline, validate};

/// What a target does with one input.
pub type Target = fn(&[u8]);

/// Every target by name, as `scripts/fuzz` and the regression test know them.
pub const TARGETS: &[(&str, Target)] = &[
    ("submit_job", submit_job),
    ("control_message", control_message),
    ("amqp_delivery", amqp_delivery),
    ("amqp_frames", amqp_frames),
    ("traceparent", traceparent),
    ("config_toml", config_toml),
    ("sim_selector", sim_selector),
    ("sim_patch", sim_patch),
    ("sim_request", sim_request),
    ("open_session", open_session),
    ("proxy_event", proxy_event),
    ("authz_request", authz_request),
];

/// Before fuzzing: with `FUZZ_WRITE_SEEDS=<dir>` in the environment, writes the seeds of `target` (made
/// from the repository in the current directory) into `dir` and exits, which is how `scripts/fuzz` gets
/// a seed corpus that is always the current examples'. Otherwise nothing.
pub fn init(target: &str) {
    let Some(dir) = std::env::var_os("FUZZ_WRITE_SEEDS") else {
        return;
    };
    let root = std::env::current_dir().expect("a current directory");
    let seeds = seeds(&root);
    let files = seeds.get(target).expect("every target has seeds");
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir).expect("the seed directory can be made");
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("a seed can be written");
    }
    eprintln!("{} seeds of {target} in {}", files.len(), dir.display());
    std::process::exit(0);
}

/// The files of a directory, by name (none when it does not exist).
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
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
fn sources(root: &Path, dir: &str, prefix: &str, suffix: &str) -> Vec<(String, Vec<u8>)> {
    files(&root.join(dir))
        .into_iter()
        .filter(|(name, _)| name.starts_with(prefix) && name.ends_with(suffix))
        .map(|(name, bytes)| (name.trim_end_matches(suffix).to_owned(), bytes))
        .collect()
}

/// The AMQP content header property list (AMQP 0-9-1, basic class): a flag word, then the properties
/// that are present, in order. Only those a publisher of jobs sets: content type, headers (a traceparent
/// and a quorum queue's delivery count), delivery mode, message id, timestamp and type.
pub fn amqp_properties(content_type: &str, type_name: &str, message_id: &str) -> Vec<u8> {
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

/// The seed corpus of every target, by target and file name, from the repository at `root`.
pub fn seeds(root: &Path) -> BTreeMap<&'static str, BTreeMap<String, Vec<u8>>> {
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
        for (stem, json) in sources(root, "schemas/examples", file_prefix, ".json") {
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
        for (stem, json) in sources(root, "tests/fixtures/invalid", file_prefix, ".json") {
            add(
                target,
                format!("invalid.{stem}.json"),
                prefixed(selector, &json),
            );
        }
    }

    // Frames as RabbitMQ sends them: one frame (the first byte picks a method or a content header),
    // valid or with short strings that are not UTF-8, and a stream of them (first byte 128 and up).
    let payload = |frame: Vec<u8>| frame[7..frame.len() - 1].to_vec();
    let submit = |kind: &[u8], headers: Vec<u8>| encode::RawProperties {
        content_type: Some(b"application/json".to_vec()),
        headers: Some(headers),
        delivery_mode: Some(2),
        message_id: Some(b"4817.1".to_vec()),
        timestamp: Some(1_767_225_600),
        kind: Some(kind.to_vec()),
        ..encode::RawProperties::default()
    };
    let mut traceparent = Vec::new();
    encode::table(
        &mut traceparent,
        &[(
            b"traceparent",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )],
    );
    let mut bad_name = Vec::new();
    encode::table(&mut bad_name, &[(b"x-\xc3(", b"v"), (b"ok", b"\xff")]);
    let valid = encode::content_header(
        1,
        2,
        &submit(b"volcano_runner.v1.SubmitJob", traceparent.clone()),
    );
    let bad_type = encode::content_header(
        1,
        2,
        &submit(b"volcano_runner.v1.Submit\xc3Job", traceparent),
    );
    let bad_header =
        encode::content_header(1, 2, &submit(b"volcano_runner.v1.SubmitJob", bad_name));
    let deliver = encode::deliver(1, b"amq.ctag-1", 1, b"volcano-runner.jobs", b"submit");
    let bad_deliver = encode::deliver(1, b"amq.ctag-1", 2, b"volcano-runner.jobs", b"sub\xffmit");
    let mut close = 404u16.to_be_bytes().to_vec();
    encode::short_str(&mut close, b"NOT_FOUND - no queue 'q\xfe'");
    close.extend_from_slice(&[0, 60, 0, 40]);
    let close = encode::method(1, 20, 40, &close);
    for (name, frame) in [
        ("deliver", deliver.clone()),
        ("deliver-bad-routing-key", bad_deliver.clone()),
        ("channel-close-bad-text", close),
    ] {
        add(
            "amqp_frames",
            format!("method.{name}"),
            prefixed(0, &payload(frame)),
        );
    }
    for (name, frame) in [
        ("submit", valid.clone()),
        ("bad-type", bad_type.clone()),
        ("bad-header-name", bad_header.clone()),
    ] {
        add(
            "amqp_frames",
            format!("header.{name}"),
            prefixed(1, &payload(frame)),
        );
    }
    let body = encode::frame(3, 1, b"{}");
    let stream = [
        deliver,
        valid,
        body.clone(),
        bad_deliver,
        bad_type,
        body.clone(),
        bad_header,
        body,
    ]
    .concat();
    for piece in [1u8, 7, 64] {
        add(
            "amqp_frames",
            format!("stream.{piece}"),
            prefixed(127 + piece, &stream),
        );
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
        for (stem, text) in sources(root, dir, prefix, ".toml") {
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

    // Session requests and proxy events: the examples in both encodings.
    for (file_prefix, message_type, target) in [
        ("open-session", MessageType::OpenSession, "open_session"),
        ("proxy-event", MessageType::ProxyEvent, "proxy_event"),
    ] {
        for (stem, json) in sources(root, "schemas/examples", file_prefix, ".json") {
            let message = messages::decode_any(message_type, Format::Json, &json)
                .unwrap_or_else(|e| panic!("{stem}: {e}"));
            let protobuf = message.encode(Format::Protobuf).expect("encodes");
            add(target, format!("{stem}.json"), prefixed(0, &json));
            add(target, format!("{stem}.pb"), prefixed(1, &protobuf));
        }
    }

    // Checks as Caddy's forward_auth and Envoy's ext_authz send them, with the session of `AUTHZ_ID`.
    let cookie = format!("_xsrf=2|a; ucloud-compute-session={AUTHZ_ID}; theme=dark");
    for (name, text) in [
        (
            "caddy-web",
            format!(
                "GET /authz\nhost: 127.0.0.1:9901\nx-forwarded-host: app-f1-0.cloud.sdu.dk\nx-forwarded-uri: /lab?x=1\nx-forwarded-method: GET\ncookie: {cookie}"
            ),
        ),
        (
            "envoy-terminal",
            format!(
                "GET /authz/.volcano-runner/terminal\nhost: app-f1-1.cloud.sdu.dk:8080\ncookie: {cookie}"
            ),
        ),
        (
            "session-url",
            format!(
                "GET /authz\nx-forwarded-host: App-F1-0.Cloud.Sdu.Dk.\nx-forwarded-uri: /.volcano-runner/session?token={AUTHZ_ID}"
            ),
        ),
        (
            "logs-host-prefixed",
            format!(
                "GET /authz/.volcano-runner/logs?follow=1\nhost: app-f1-0.cloud.sdu.dk\ncookie: __Host-ucloud-compute-session-web={AUTHZ_ID}\ncookie: a=b"
            ),
        ),
        (
            "not-routed",
            "GET /authz/\nhost: app-gone-0.cloud.sdu.dk\ncookie: ucloud-compute-session=x"
                .to_owned(),
        ),
        ("not-a-check", "GET /authzz\nhost: x".to_owned()),
    ] {
        add("authz_request", name.to_owned(), text.into_bytes());
    }
    seeds
}

/// The runner's default configuration: the rules a submission is checked against and the settings it
/// is rendered with.
fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::default)
}

/// 2026-01-01T00:00:00Z: a render only records the time, so a fixed one replays the same way.
fn now() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_767_225_600).expect("a valid instant")
}

/// The input split at its first byte, whose low bit picks the encoding of the rest.
fn format_and_body(data: &[u8]) -> Option<(u8, Format, &[u8])> {
    let (&first, body) = data.split_first()?;
    let format = if first & 1 == 0 {
        Format::Json
    } else {
        Format::Protobuf
    };
    Some((first, format, body))
}

/// A SubmitJob body, JSON or protobuf (the first byte picks), through everything the runner does with it
/// before touching the cluster: decode (and when that fails, the job id and fingerprint a rejection
/// names), the fingerprint, validation, and for a valid job the render of its Kubernetes objects.
pub fn submit_job(data: &[u8]) {
    let Some((_, format, body)) = format_and_body(data) else {
        return;
    };
    let job: SubmitJob = match messages::decode(format, body) {
        Ok(job) => job,
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
            let _ = messages::peek_job_id(format, body);
            let _ = ids::body_fingerprint16(body);
            return;
        }
    };
    let _ = ids::fingerprint16(&pipeline::fingerprint(&job));
    match validate::submit(&job, config()) {
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
        }
        Ok(()) => {
            // A valid job encodes again in both formats: the runner records and reports it.
            for format in [Format::Json, Format::Protobuf] {
                messages::encode(format, &job).expect("a valid submission encodes");
            }
            if let Err(e) = pipeline::render(&job, config(), now()) {
                let _ = e.to_string();
            }
        }
    }
}

/// A CancelJob or ExtendJob body (the first byte's second bit picks which, its first bit JSON or
/// protobuf): decode, the job id a rejection names, validation, and the cancel reason as recorded.
pub fn control_message(data: &[u8]) {
    let Some((first, format, body)) = format_and_body(data) else {
        return;
    };
    let message_type = if first & 2 == 0 {
        MessageType::CancelJob
    } else {
        MessageType::ExtendJob
    };
    let message = match messages::decode_any(message_type, format, body) {
        Ok(message) => message,
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
            let _ = messages::peek_job_id(format, body);
            return;
        }
    };
    let job_id = match &message {
        AnyMessage::CancelJob(m) => &m.job_id,
        AnyMessage::ExtendJob(m) => &m.job_id,
        _ => unreachable!("decoded as {message_type:?}"),
    };
    let _ = validate::readable_job_id(job_id);
    match validate::message(&message, config()) {
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
        }
        Ok(()) => {
            if let AnyMessage::CancelJob(cancel) = &message {
                let _ = validate::text::cancel_reason(cancel.reason.as_deref().unwrap_or_default());
            }
            for format in [Format::Json, Format::Protobuf] {
                message.encode(format).expect("a valid message encodes");
            }
        }
    }
}

/// A delivery as it comes off the wire: the content header's property list (flags, then content type,
/// headers table, delivery mode, ..., timestamp, type, ...; the AMQP encoding lapin parses), followed by
/// the body. The property list goes through the connection's sanitizer first, as on a real connection:
/// whatever bytes it carries, what the sanitizer hands on parses (and a list lapin parses as it is passes
/// unchanged). Then what the runner reads from it: the properties the sanitizer found not UTF-8 and the
/// reason they give, the delivery count, the headers a dead-letter copy keeps, the trace context, and the
/// body decoded by the `type` and `content_type` properties, then validated.
pub fn amqp_delivery(data: &[u8]) {
    let as_sent = lapin::protocol::basic::parse_properties(data);
    let Some((list, used)) = sanitize::repair_properties(data, &[]) else {
        // Shorter than its flags say: no broker sends that, and lapin refuses it as well.
        assert!(
            as_sent.is_err(),
            "lapin parses what the sanitizer found cut short"
        );
        return;
    };
    let body = &data[used..];
    let (rest, props) = lapin::protocol::basic::parse_properties(&list[..])
        .expect("what the sanitizer hands on parses");
    assert!(
        rest.is_empty(),
        "the property list ends where the sanitizer says"
    );
    if as_sent.is_ok() {
        assert_eq!(
            &list[..],
            &data[..used],
            "a parseable list passes unchanged"
        );
    }
    if let Some(names) = properties::invalid_properties(&props) {
        let reason = properties::invalid_properties_reason(&names);
        assert_eq!(reason.code, properties::INVALID_PROPERTY);
        assert!(reason.field.is_some());
    }
    let _ = properties::delivery_count(&props);
    // What a dead-letter copy keeps of the headers: within its budget, and all of them when they fit.
    let table = props.headers().clone().unwrap_or_default();
    let size = |t: &FieldTable| -> usize {
        t.inner()
            .iter()
            .map(|(name, value)| 1 + name.as_str().len() + consumer::encoded_len(value))
            .sum()
    };
    let before = size(&table);
    let (kept, dropped) = consumer::within_budget(table);
    assert!(size(&kept) <= consumer::DEAD_LETTER_HEADERS_MAX);
    assert_eq!(
        dropped.is_empty(),
        before <= consumer::DEAD_LETTER_HEADERS_MAX
    );
    let traceparent = properties::traceparent(&props);
    if let Some(tp) = traceparent.as_deref().and_then(TraceParent::parse) {
        TraceContext::parse(tp.as_str()).expect("what is passed on parses");
    }
    let _ = TraceContext::continue_from(traceparent.as_deref()).traceparent();
    let type_name = props.kind().as_ref().map(|s| s.as_str());
    let content_type = props.content_type().as_ref().map(|s| s.as_str());
    match messages::decode_inbound(type_name, content_type, body) {
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
            let format = content_type
                .and_then(|ct| Format::from_content_type(ct).ok())
                .unwrap_or(Format::Json);
            let _ = messages::peek_job_id(format, body);
        }
        Ok(inbound) => {
            let _ = validate::readable_job_id(inbound.job_id());
            let checked = match &inbound {
                Inbound::Submit(job) => validate::submit(job, config()),
                Inbound::Cancel(cancel) => validate::cancel(cancel),
                Inbound::Extend(extend) => validate::extend(extend),
            };
            if let Err(e) = checked {
                let _ = (e.to_string(), e.field(), e.reason());
            }
        }
    }
}

/// Whether amq-protocol (lapin's parser) parses `bytes` as exactly one frame.
fn amq_parses(bytes: &[u8]) -> bool {
    matches!(amq_protocol::frame::parse_frame(bytes), Ok(([], _)))
}

/// Raw frames from the server, as the connection's sanitizer sees them before lapin. The first byte
/// picks how: below 128, the rest is one frame's type (method or content header, by the lowest bit of
/// the first byte), channel 1 and payload, and
/// - a frame amq-protocol parses as it is passes unchanged ([`Repair::Clean`]);
/// - a frame the sanitizer rewrites, amq-protocol parses; a frame amq-protocol refuses is rewritten or
///   left to lapin as one the sanitizer does not know ([`Repair::Unknown`]), never called clean;
/// - a frame the sanitizer does not know, amq-protocol refuses too (the sanitizer knows every method and
///   the whole content header grammar amq-protocol parses, so nothing parseable escapes it).
///
/// From 128 on, the rest is a byte stream, fed to the incremental [`Sanitizer`] whole and in pieces of
/// `first - 127` bytes: the output must not depend on how the bytes arrived.
pub fn amqp_frames(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first < 128 {
        let kind = 1 + (first & 1);
        let raw = encode::frame(kind, 1, rest);
        let parses = amq_parses(&raw);
        match sanitize::repair_frame(&raw, &[], Some(sanitize::MAX_INSPECTED_FRAME)) {
            Repair::Clean => assert!(parses, "called clean, refused by amq-protocol"),
            Repair::Rewritten(out) => {
                assert!(!parses, "a parseable frame was rewritten");
                assert!(amq_parses(&out), "amq-protocol refuses a rewritten frame");
            }
            Repair::Unknown => assert!(
                !parses,
                "amq-protocol parses a frame the sanitizer does not know"
            ),
        }
        return;
    }
    let piece = usize::from(first - 127);
    let mut whole = Sanitizer::new(0);
    let mut at_once = Vec::new();
    whole.push(rest, &mut at_once);
    whole.finish(&mut at_once);
    let mut pieces = Sanitizer::new(0);
    let mut in_pieces = Vec::new();
    for chunk in rest.chunks(piece) {
        pieces.push(chunk, &mut in_pieces);
    }
    pieces.finish(&mut in_pieces);
    assert_eq!(
        at_once, in_pieces,
        "the output depends on how the input arrived"
    );
}

/// A `traceparent` header value (any bytes, read as the consumer reads a header: lossily as UTF-8)
/// through the one parser of the header. An accepted value round-trips, and every reader agrees on it.
pub fn traceparent(data: &[u8]) {
    let header = String::from_utf8_lossy(data);
    let parsed = TraceContext::parse(&header);
    let passed_on = TraceParent::parse(&header);
    assert_eq!(parsed.is_ok(), passed_on.is_some(), "{header:?}");
    match parsed {
        Ok(ctx) => {
            let again = TraceContext::parse(&ctx.traceparent()).expect("its own header parses");
            assert!(again == ctx, "{header:?} does not round-trip");
            let child = ctx.child();
            assert!(child.trace_id() == ctx.trace_id() && child.parent_id() == Some(ctx.span_id()));
        }
        Err(why) => {
            let _ = why.to_string();
        }
    }
    let annotations = BTreeMap::from([(annotation_key("fuzz/"), header.clone().into_owned())]);
    assert_eq!(
        TraceContext::from_annotations(&annotations, "fuzz/").is_some(),
        passed_on.is_some()
    );
}

/// The configuration loader: a file's text and, after the first NUL byte, `NAME=value` lines as
/// environment overrides (`VOLCANO_RUNNER_*`), through parsing, overrides, typing and every section's
/// checks. A configuration it accepts passes its checks again and renders a valid submission.
pub fn config_toml(data: &[u8]) {
    let (file, env) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(file) else {
        return;
    };
    let env = String::from_utf8_lossy(env);
    let vars = env.lines().filter_map(|line| {
        let (name, value) = line.split_once('=')?;
        Some((name.to_owned(), value.to_owned()))
    });
    match Config::from_sources(Some((Path::new("fuzz.toml"), text)), vars) {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(config) => {
            let _ = config.secrets();
            config
                .check()
                .expect("a loaded configuration passes its own checks");
            let job = example_job();
            if validate::submit(job, &config).is_ok()
                && let Err(e) = pipeline::render(job, &config, now())
            {
                let _ = e.to_string();
            }
        }
    }
}

fn example_job() -> &'static SubmitJob {
    static JOB: OnceLock<SubmitJob> = OnceLock::new();
    JOB.get_or_init(|| {
        let body = include_bytes!("../schemas/examples/submit-job.mpi-2-nodes.json");
        messages::decode(Format::Json, body).expect("the example decodes")
    })
}

/// The fields a pod list may select on in the simulator.
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
];

/// The simulator's label and field selectors (the `labelSelector` and `fieldSelector` query
/// parameters, and a Service's structured selector): the selector up to the first newline, then a JSON
/// object to match (and to read as a structured selector).
pub fn sim_selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (selector, object) = text.split_once('\n').unwrap_or((text, "{}"));
    let object: Value = serde_json::from_str(object).unwrap_or(Value::Null);
    match LabelSelector::parse(selector) {
        Ok(labels) => {
            let _ = labels.matches_object(&object);
        }
        Err(e) => assert!(!e.is_empty(), "an error says what is wrong"),
    }
    match FieldSelector::parse(selector, POD_FIELDS) {
        Ok(fields) => {
            let _ = fields.matches(&object);
            for field in POD_FIELDS {
                let _ = fields.pinned(field);
            }
        }
        Err(e) => assert!(!e.is_empty(), "an error says what is wrong"),
    }
    let _ = LabelSelector::from_structured(&object).matches_object(&object);
}

/// The simulator's patch bodies: a JSON document, a newline, then a patch applied to it as a merge
/// patch, a JSON patch and a strategic merge patch (the three `PATCH` content types read as JSON).
pub fn sim_patch(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((target, body)) = text.split_once('\n') else {
        return;
    };
    let (Ok(target), Ok(body)) = (
        serde_json::from_str::<Value>(target),
        serde_json::from_str::<Value>(body),
    ) else {
        return;
    };
    let mut merged = target.clone();
    patch::merge(&mut merged, &body);
    let mut patched = target.clone();
    if let Err(e) = patch::json_patch(&mut patched, &body) {
        let _ = e.to_string();
    }
    let mut strategic = target;
    if let Err(e) = patch::strategic_merge(&mut strategic, &body) {
        let _ = e.to_string();
    }
}

/// How many requests one simulator serves before a fresh one is built (what requests create stays,
/// so memory would grow without bound).
const SIM_REBUILD_EVERY: u32 = 5_000;

struct Sim {
    runtime: tokio::runtime::Runtime,
    router: Router,
    served: u32,
}

impl Sim {
    /// A simulator at a fixed time holding the namespace `fuzz` with a pod `p`, so that per-object
    /// routes (log, status, eviction) answer from the first input.
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let mut config = SimConfig::for_tests();
        config.start_time = "2026-01-01T00:00:00Z".into();
        let router = Simulator::in_process(&config).expect("the test configuration is valid");
        let sim = Sim {
            runtime,
            router,
            served: 0,
        };
        for setup in SIM_SETUP {
            let request = parse_request(setup.as_bytes()).expect("a setup request");
            let status = sim.send(request);
            assert!(status < 300, "{setup}: {status}");
        }
        sim
    }

    /// Sends one request and reads the answer as far as it is ready (a watch or a followed log goes
    /// on); returns the status.
    fn send(&self, request: Request<Body>) -> u16 {
        let router = self.router.clone();
        self.runtime.block_on(async move {
            let response = router.oneshot(request).await.expect("infallible");
            let status = response.status().as_u16();
            let mut body = response.into_body();
            while let Some(Some(frame)) = body.frame().now_or_never() {
                if frame.is_err() {
                    break;
                }
            }
            status
        })
    }
}

const SIM_SETUP: &[&str] = &[
    "POST /api/v1/namespaces\ncontent-type: application/json\n\n\
     {\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"fuzz\"}}",
    "POST /api/v1/namespaces/fuzz/pods\ncontent-type: application/json\n\n\
     {\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"labels\":{\"app\":\"x\"}},\
     \"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"busybox\"}]}}",
];

thread_local! {
    static SIM: RefCell<Option<Sim>> = const { RefCell::new(None) };
}

/// `METHOD /path?query`, then `Name: value` header lines, an empty line, and the body.
fn parse_request(data: &[u8]) -> Option<Request<Body>> {
    let text = std::str::from_utf8(data).ok()?;
    let (head, body) = text.split_once("\n\n").unwrap_or((text, ""));
    let mut lines = head.lines();
    let (method, target) = lines.next()?.split_once(' ')?;
    let method = Method::from_bytes(method.as_bytes()).ok()?;
    let mut request = Request::builder().method(method).uri(target);
    for line in lines {
        let (name, value) = line.split_once(':')?;
        request = request.header(name.trim(), value.trim());
    }
    request.body(Body::from(body.to_owned())).ok()
}

/// A request to the simulator's API server, in-process: the request line (`METHOD /path?query`),
/// headers, an empty line, then the body. Every route, query parameter (selectors, limits, log and
/// delete options) and body (objects, patches of each content type, DeleteOptions) is parsed as from a
/// real client; bad input must be answered with a status, never a panic.
pub fn sim_request(data: &[u8]) {
    let Some(request) = parse_request(data) else {
        return;
    };
    SIM.with_borrow_mut(|slot| {
        let sim = slot.get_or_insert_with(Sim::new);
        let status = sim.send(request);
        assert!((200..600).contains(&status), "status {status}");
        sim.served += 1;
        if sim.served >= SIM_REBUILD_EVERY {
            *slot = None;
        }
    });
}

/// An OpenSession body, JSON or protobuf (the first byte picks), through what the runner's issuer does
/// before it reads the cluster: decode (and the job id a refusal names), validation, the kind; a valid
/// request encodes again in both formats.
pub fn open_session(data: &[u8]) {
    let Some((_, format, body)) = format_and_body(data) else {
        return;
    };
    let request: OpenSession = match messages::decode(format, body) {
        Ok(request) => request,
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
            let _ = messages::peek_job_id(format, body);
            return;
        }
    };
    match validate::open_session(&request) {
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
        }
        Ok(()) => {
            assert!(Kind::from_proto(request.kind).is_some(), "a valid kind");
            for format in [Format::Json, Format::Protobuf] {
                messages::encode(format, &request).expect("a valid request encodes");
            }
        }
    }
}

fn naming() -> HostNaming {
    HostNaming {
        prefix: "app-".into(),
        domain: "cloud.sdu.dk".into(),
    }
}

/// A ProxyEvent delivery as proxy-sync reads it (the first byte picks JSON or protobuf, as its
/// `content_type`): decode by the AMQP properties, the contract's checks, then, for a valid event, the
/// route table it goes into (beside a job already routed), applied twice (the second changes nothing),
/// and the Envoy files and the Caddy configuration made from the table.
pub fn proxy_event(data: &[u8]) {
    let Some((_, format, body)) = format_and_body(data) else {
        return;
    };
    let event = match OutboundEvent::decode(
        Some(MessageType::ProxyEvent.amqp_type()),
        Some(format.content_type()),
        body,
    ) {
        Ok(OutboundEvent::Proxy(event)) => event,
        Ok(other) => panic!("a ProxyEvent decoded as {}", other.type_name()),
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.reason());
            return;
        }
    };
    let update = match JobUpdate::from_event(&event) {
        Ok(update) => update,
        Err(e) => {
            let _ = (e.to_string(), e.field(), e.kind().code());
            return;
        }
    };
    let mut table = RouteTable::new();
    table.apply(JobUpdate::from_event(&baseline_event()).expect("the baseline is valid"));
    table.apply(update.clone());
    assert_ne!(
        table.apply(update),
        Applied::Changed,
        "the same event twice"
    );
    let naming = naming();
    let routes = table.routes(&naming);
    let envoy_settings = EnvoySettings {
        dir: std::path::PathBuf::from("/nonexistent"),
        listen_port: 8080,
        connect_timeout_ms: 5000,
        authz: volcano_runner::config::proxy_sync::Upstream::parse("http://127.0.0.1:9901/authz")
            .ok(),
        bridge: volcano_runner::config::proxy_sync::Upstream::parse("http://127.0.0.1:9902").ok(),
    };
    let files = envoy::render(&table, &naming, &envoy_settings);
    let rds = files
        .iter()
        .find(|(name, _)| *name == envoy::RDS_FILE)
        .map(|(_, v)| v.clone())
        .expect("routes are rendered");
    let hosts: std::collections::BTreeSet<&str> = rds["resources"][0]["virtual_hosts"]
        .as_array()
        .expect("virtual hosts")
        .iter()
        .filter_map(|vh| vh["domains"][0].as_str())
        .collect();
    for r in &routes {
        assert!(
            hosts.contains(r.host.as_str()),
            "{} not in the routes",
            r.host
        );
    }
    let caddy_settings = CaddySettings {
        admin: volcano_runner::config::proxy_sync::Upstream::parse("http://127.0.0.1:2019")
            .expect("a URL"),
        listen_port: 8080,
        authz: None,
        bridge: envoy_settings.bridge.clone(),
    };
    let (config, _) = caddy::config(&routes, &caddy_settings);
    assert_eq!(caddy::live_hosts(&config).len(), routes.len());
}

/// A job routed in every table the targets build: rank 0 with a pod, rank 1 bridges only.
fn baseline_event() -> ProxyEvent {
    serde_json::from_value(serde_json::json!({
        "eventId": "f1/proxy/create/1",
        "jobId": "f1",
        "action": "PROXY_ACTION_CREATE",
        "targets": [
            {"rank": 0, "podIp": "10.0.0.1", "port": 8888, "hostname": "j-f1-job-0.j-f1"},
            {"rank": 1, "podIp": "10.0.0.2", "hostname": "j-f1-job-1.j-f1"},
        ],
        "timestamp": "2026-01-01T00:00:00Z",
        "sequence": 1,
    }))
    .expect("the baseline event reads")
}

/// The id of the one live session of the check the `authz_request` target asks (web, job f1, rank 0).
pub const AUTHZ_ID: &str = "fuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzzfuzz-_0";

thread_local! {
    static AUTHZ: Authz = {
        let mut table = RouteTable::new();
        table.apply(JobUpdate::from_event(&baseline_event()).expect("the baseline is valid"));
        let hash = Hash::of(AUTHZ_ID);
        let record = SessionRecord {
            hash,
            job_id: "f1".into(),
            rank: 0,
            kind: Kind::Web,
            issued_at: now(),
            expires_at: now().checked_add(jiff::SignedDuration::from_hours(1)).expect("in range"),
        };
        let sessions = Sessions::listed(BTreeMap::from([(
            (name_for(&hash), "volcano-runner".to_owned()),
            Some(record),
        )]));
        Authz::new(
            sessions,
            "volcano-runner".into(),
            Routes::from_table(table),
            naming(),
            std::sync::Arc::new(now),
        )
    };
}

/// A request to the session check (`/authz`), as Caddy's forward_auth or Envoy's ext_authz sends it: the
/// request line (`METHOD /path?query`), then header lines. Its original host, path and cookies are read
/// and decided against one routed job and one live session ([`AUTHZ_ID`]). The answer is a status the
/// check gives, and an allowed request's cookies for the pod never hold a session cookie.
pub fn authz_request(data: &[u8]) {
    let Some(request) = parse_request(data) else {
        return;
    };
    let (parts, _) = request.into_parts();
    let _ = authz_server::original(&parts.uri, &parts.headers);
    for bridges in [false, true] {
        let answer = AUTHZ.with(|authz| {
            authz_server::answer(
                authz,
                Answering {
                    secure: bridges,
                    bridges,
                },
                None,
                &parts.method,
                &parts.uri,
                &parts.headers,
            )
        });
        let status = answer.status().as_u16();
        assert!(
            [200, 302, 401, 403, 404].contains(&status),
            "status {status}"
        );
        if status == 200 {
            let h = answer.headers();
            assert!(h.contains_key(authz_server::HEADER_UPSTREAM), "{h:?}");
            for name in [authz_server::HEADER_COOKIE, "cookie"] {
                for value in h.get_all(name) {
                    let value = value.to_str().expect("cookies are text");
                    for pair in value.split(';') {
                        let cookie = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
                        assert!(
                            !authz_server::is_session_cookie_name(cookie),
                            "a session cookie for the pod: {value}"
                        );
                    }
                }
            }
            assert!(
                !h.contains_key("cookie") || !h.contains_key(authz_server::ENVOY_REMOVE),
                "both keep and remove the cookie: {h:?}"
            );
        }
    }
}
