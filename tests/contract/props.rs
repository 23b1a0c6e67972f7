//! Property tests for the message contract:
//! - generated prost values of every message, serialised to JSON, validate against the JSON Schema and
//!   survive JSON and protobuf round trips (the schema describes what the encoder writes);
//! - arbitrary bytes, arbitrary JSON and randomly mutated examples never panic the decoder or the
//!   validator, and whatever passes validation re-encodes to JSON that the schema accepts;
//! - the image reference parser accepts every reference the grammar generates, and never accepts what
//!   the schema's pattern rejects.

use crate::support;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use pbjson_types::{Duration, Timestamp};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;
use volcano_runner::config::Config;
use volcano_runner::messages::{self, AnyMessage, Format, MessageType, v1};
use volcano_runner::validate;

fn validators() -> &'static BTreeMap<MessageType, jsonschema::Validator> {
    static V: OnceLock<BTreeMap<MessageType, jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| {
        MessageType::ALL
            .into_iter()
            .map(|t| (t, support::validator(t)))
            .collect()
    })
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(support::test_config)
}

// ---------------------------------------------------------------------------------------------------
// Strategies for valid-shaped values.

fn job_id() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?"
}

fn some_text() -> impl Strategy<Value = String> {
    ".{1,12}"
}

fn dns_subdomain() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?){0,3}"
}

fn env_name() -> impl Strategy<Value = String> {
    "[A-Za-z_.-][A-Za-z0-9_.-]{0,15}"
}

fn storage_path() -> impl Strategy<Value = String> {
    "(/[a-zA-Z0-9 _'().-]{1,12}){1,4}/?".prop_filter("no . or .. components", |p| {
        !p.split('/').any(|c| c == "." || c == "..")
    })
}

fn ip_address() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<Ipv4Addr>().prop_map(|a| a.to_string()),
        any::<Ipv6Addr>().prop_map(|a| a.to_string()),
    ]
}

fn finite() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("finite", |f| f.is_finite())
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (-62_135_596_800i64..=253_402_300_799, 0i32..1_000_000_000)
        .prop_map(|(seconds, nanos)| Timestamp { seconds, nanos })
}

/// A time allocation or extension: positive, at most 100 years (36,600 days).
fn time_allocation() -> impl Strategy<Value = Duration> {
    let max = validate::TIME_ALLOCATION_MAX_SECONDS;
    (0i64..=max, 0i32..1_000_000_000)
        .prop_map(move |(seconds, nanos)| Duration {
            seconds,
            nanos: if seconds == max { 0 } else { nanos },
        })
        .prop_filter("positive", |d| d.seconds > 0 || d.nanos > 0)
}

/// A peer's host name: a Service name, not `j-...`.
fn peer_hostname() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,10}[a-z0-9])?".prop_filter("not j-", |h| !h.starts_with("j-"))
}

fn port() -> impl Strategy<Value = u32> {
    1u32..=65535
}

/// `[a-z0-9]+ (separator [a-z0-9]+)*`; `dots` allows `.` as a separator.
fn path_component(dots: bool) -> BoxedStrategy<String> {
    let separator = if dots {
        "([._]|__|-{1,3})"
    } else {
        "(_|__|-{1,3})"
    };
    proptest::string::string_regex(&format!(
        "[a-z0-9]{{1,5}}({separator}[a-z0-9]{{1,5}}){{0,2}}"
    ))
    .expect("a valid regex")
    .boxed()
}

/// Image references from the grammar. Without a registry the first component has no `.`, because
/// such a component is read as a registry (as Docker does).
fn image_reference() -> impl Strategy<Value = String> {
    let domain = option::of(prop_oneof![
        Just("dreg.cloud.sdu.dk".to_owned()),
        Just("localhost:5000".to_owned()),
        Just("localhost".to_owned()),
        Just("[::1]:5000".to_owned()),
        Just("Registry".to_owned()),
        "[a-z0-9]{1,6}(\\.[a-z0-9]{1,6}){1,2}(:[0-9]{1,5})?",
    ]);
    (
        domain,
        path_component(false),
        vec(path_component(true), 0..3),
        option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}"),
        option::of("sha256:[0-9a-f]{64}"),
    )
        .prop_map(|(domain, first, rest, tag, digest)| {
            let mut s = domain.map(|d| format!("{d}/")).unwrap_or_default();
            s.push_str(&first);
            for c in rest {
                s.push('/');
                s.push_str(&c);
            }
            if let Some(t) = tag {
                s.push(':');
                s.push_str(&t);
            }
            if let Some(d) = digest {
                s.push('@');
                s.push_str(&d);
            }
            s
        })
}

fn file_value() -> impl Strategy<Value = v1::FileValue> {
    (storage_path(), any::<bool>()).prop_map(|(path, read_only)| v1::FileValue { path, read_only })
}

fn peer_value() -> impl Strategy<Value = v1::PeerValue> {
    (peer_hostname(), job_id()).prop_map(|(hostname, job_id)| v1::PeerValue { hostname, job_id })
}

fn ingress_value() -> impl Strategy<Value = v1::IngressValue> {
    (some_text(), dns_subdomain()).prop_map(|(id, domain)| v1::IngressValue { id, domain })
}

fn network_ip_value() -> impl Strategy<Value = v1::NetworkIpValue> {
    let range = (port(), port(), 1i32..=2).prop_map(|(start, end, protocol)| v1::PortRange {
        start,
        end,
        protocol,
    });
    (some_text(), ip_address(), vec(range, 0..3)).prop_map(|(id, ip_address, open_ports)| {
        v1::NetworkIpValue {
            id,
            ip_address,
            open_ports,
        }
    })
}

fn parameter_value() -> impl Strategy<Value = v1::ParameterValue> {
    use v1::parameter_value::Value as V;
    prop_oneof![
        any::<String>().prop_map(V::Text),
        any::<String>().prop_map(V::Textarea),
        any::<i64>().prop_map(V::Integer),
        finite().prop_map(V::FloatingPoint),
        any::<bool>().prop_map(V::Boolean),
        any::<String>().prop_map(V::Enumeration),
        file_value().prop_map(V::File),
        peer_value().prop_map(V::Peer),
        some_text().prop_map(|id| V::LicenseServer(v1::LicenseServerValue { id })),
        ingress_value().prop_map(V::Ingress),
        network_ip_value().prop_map(V::NetworkIp),
    ]
    .prop_map(|value| v1::ParameterValue { value: Some(value) })
}

fn resource_value() -> impl Strategy<Value = v1::ResourceValue> {
    use v1::resource_value::Value as V;
    prop_oneof![
        file_value().prop_map(V::File),
        peer_value().prop_map(V::Peer),
        ingress_value().prop_map(V::Ingress),
        network_ip_value().prop_map(V::NetworkIp),
    ]
    .prop_map(|value| v1::ResourceValue { value: Some(value) })
}

fn invocation() -> impl Strategy<Value = v1::InvocationParameter> {
    use v1::invocation_parameter::Kind;
    let var = (
        vec(some_text(), 1..3),
        (
            any::<String>(),
            any::<String>(),
            any::<String>(),
            any::<String>(),
        ),
        any::<(bool, bool)>(),
    )
        .prop_map(|(variable_names, (pg, sg, pv, sv), (pa, sa))| {
            Kind::Var(v1::VariableInvocation {
                variable_names,
                prefix_global: pg,
                suffix_global: sg,
                prefix_variable: pv,
                suffix_variable: sv,
                is_prefix_variable_part_of_arg: pa,
                is_suffix_variable_part_of_arg: sa,
            })
        });
    prop_oneof![
        any::<String>().prop_map(|word| Kind::Word(v1::WordInvocation { word })),
        var,
        (some_text(), "-{1,2}[a-z]{1,8}").prop_map(|(variable_name, flag)| {
            Kind::BoolFlag(v1::BooleanFlagInvocation {
                variable_name,
                flag,
            })
        }),
        env_name().prop_map(|variable| Kind::Env(v1::EnvironmentVariableInvocation { variable })),
    ]
    .prop_map(|kind| v1::InvocationParameter { kind: Some(kind) })
}

fn parameter_definition() -> impl Strategy<Value = v1::ParameterDefinition> {
    let option =
        (some_text(), any::<String>()).prop_map(|(name, value)| v1::EnumOption { name, value });
    (
        some_text(),
        1i32..=12,
        any::<bool>(),
        (option::of(any::<String>()), option::of(any::<String>())),
        (option::of(finite()), option::of(finite())),
        (option::of(any::<String>()), option::of(any::<String>())),
        vec(option, 1..4),
    )
        .prop_map(
            |(name, r#type, optional, (title, description), (min, max), (t, f), options)| {
                let enumeration = r#type == v1::ParameterType::Enumeration as i32;
                v1::ParameterDefinition {
                    name,
                    r#type,
                    optional,
                    title,
                    description,
                    min,
                    max,
                    true_value: t,
                    false_value: f,
                    options: if enumeration { options } else { Vec::new() },
                }
            },
        )
}

fn application() -> impl Strategy<Value = v1::Application> {
    let container = option::of(
        (
            option::of(any::<bool>()),
            option::of(any::<bool>()),
            option::of(any::<bool>()),
        )
            .prop_map(|(c, r, u)| v1::ContainerOptions {
                change_working_directory: c,
                run_as_root: r,
                run_as_real_user: u,
            }),
    );
    (
        (
            some_text(),
            some_text(),
            option::of(any::<String>()),
            image_reference(),
        ),
        vec(invocation(), 0..4),
        btree_map(env_name(), invocation(), 0..3),
        vec(parameter_definition(), 0..4),
        container,
        (
            option::of(port()),
            option::of(port()),
            option::of(any::<String>()),
        ),
        1i32..=4,
    )
        .prop_map(
            |(
                (name, version, title, image),
                invocation,
                environment,
                parameters,
                container,
                ports,
                t,
            )| {
                let (web_port, vnc_port, vnc_password) = ports;
                let web_port = web_port.or((t == v1::ApplicationType::Web as i32).then_some(8080));
                let vnc_port = vnc_port.or((t == v1::ApplicationType::Vnc as i32).then_some(5900));
                v1::Application {
                    name,
                    version,
                    title,
                    image,
                    invocation,
                    environment,
                    parameters,
                    container,
                    web_port,
                    vnc_port,
                    vnc_password,
                    application_type: t,
                }
            },
        )
}

fn submit_job() -> impl Strategy<Value = v1::SubmitJob> {
    let owner = (some_text(), option::of(some_text()))
        .prop_map(|(user, project)| v1::Owner { user, project });
    let product = (
        "[a-z0-9-]{1,12}",
        "[a-z0-9-]{1,12}",
        1u32..,
        1u32..,
        any::<u32>(),
    )
        .prop_map(|(id, category, cpu, memory_gib, gpu)| v1::Product {
            id,
            category,
            cpu,
            memory_gib,
            gpu,
        });
    (
        (
            job_id(),
            owner,
            option::of(".{0,40}"),
            application(),
            product,
            1u32..,
        ),
        option::of(time_allocation()),
        btree_map(".{0,8}", parameter_value(), 0..4),
        vec(resource_value(), 0..3),
        (
            option::of(storage_path()),
            option::of(timestamp()),
            option::of(storage_path()),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (job_id, owner, job_name, app, product, replicas),
                time,
                parameters,
                resources,
                rest,
            )| {
                let (output_folder, submitted_at, opened_file, exclusive_nodes) = rest;
                // A whole-node job needs a time limit (schema and validation).
                let exclusive_nodes = exclusive_nodes && time.is_some();
                // Varies with the draw, so both values travel through the codecs.
                let sealed = job_id.len() % 2 == 0;
                // A booked start needs a time limit and no whole nodes (validation); drawn from the
                // submission time, which is a valid timestamp.
                let start_window = submitted_at
                    .filter(|_| time.is_some() && !exclusive_nodes && job_name.is_some())
                    .map(|t| v1::StartWindow {
                        earliest: Some(t),
                        latest: Some(t),
                    });
                v1::SubmitJob {
                    job_id,
                    owner: Some(owner),
                    job_name,
                    application: Some(app),
                    product: Some(product),
                    replicas,
                    time_allocation: time,
                    parameters,
                    resources,
                    output_folder,
                    submitted_at,
                    // Any bool: it varies with the draw.
                    traced: opened_file.is_some(),
                    opened_file,
                    exclusive_nodes,
                    sealed,
                    start_window,
                }
            },
        )
}

fn cancel_job() -> impl Strategy<Value = v1::CancelJob> {
    (job_id(), option::of(any::<String>()))
        .prop_map(|(job_id, reason)| v1::CancelJob { job_id, reason })
}

fn extend_job() -> impl Strategy<Value = v1::ExtendJob> {
    (job_id(), "[A-Za-z0-9._:-]{1,32}", time_allocation()).prop_map(|(job_id, request_id, d)| {
        v1::ExtendJob {
            job_id,
            request_id,
            extension: Some(d),
        }
    })
}

fn job_event() -> impl Strategy<Value = v1::JobEvent> {
    let exit =
        (any::<u32>(), any::<i32>()).prop_map(|(rank, exit_code)| v1::RankExit { rank, exit_code });
    let log = (any::<u32>(), any::<String>()).prop_map(|(rank, tail)| v1::RankLog { rank, tail });
    let pending = (
        (
            some_text(),
            option::of(any::<u32>()),
            any::<u32>(),
            any::<u32>(),
            any::<String>(),
        ),
        (option::of(timestamp()), any::<String>(), any::<bool>()),
        (
            any::<bool>(),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
        ),
    )
        .prop_map(
            |(
                (queue, jobs_ahead, unschedulable_pods, total_pods, message),
                (estimated_start_at, estimate_basis, never_fits),
                (estimate_is_bound, expectations_held, expectations_made),
            )| v1::PendingDetails {
                queue,
                jobs_ahead,
                unschedulable_pods,
                total_pods,
                message,
                estimated_start_at,
                estimate_basis,
                never_fits,
                estimate_is_bound,
                expectations_held,
                expectations_made,
            },
        );
    (
        (
            some_text(),
            job_id(),
            0i32..=6,
            some_text(),
            any::<String>(),
        ),
        (
            vec(exit, 0..3),
            option::of(pending.prop_map(Box::new)),
            option::of(timestamp()),
            timestamp(),
        ),
        (
            some_text(),
            vec(log, 0..3),
            option::of(timestamp()),
            option::of(timestamp()),
            0i64..=i64::MAX,
            option::of(kept_output()),
            option::of(kept_trace()),
        ),
    )
        .prop_map(
            |(
                (event_id, job_id, state, status, reason),
                (exit_codes, pending, expires_at, ts),
                rest,
            )| {
                let (runner_id, log_tails, started_at, ended_at, refundable_ms, output, trace) =
                    rest;
                // A booking's answer, drawn from the times: both ends, and a refusal's window.
                let booking = started_at.map(|start| {
                    Box::new(v1::BookingDetails {
                        start_at: Some(start),
                        end_at: ended_at,
                        nodes: vec!["n1".into()],
                        earliest_window: ended_at.map(|end| v1::BookedWindow {
                            earliest: Some(start),
                            latest: Some(end),
                        }),
                    })
                });
                v1::JobEvent {
                    event_id,
                    job_id,
                    state,
                    status,
                    reason,
                    exit_codes,
                    pending,
                    expires_at,
                    timestamp: Some(ts),
                    runner_id,
                    log_tails,
                    started_at,
                    ended_at,
                    refundable_ms,
                    output: output.map(Box::new),
                    trace: trace.map(Box::new),
                    booking,
                }
            },
        )
}

/// Where a traced job's trace is (JobEvent field 16).
fn kept_trace() -> impl Strategy<Value = v1::KeptTrace> {
    (some_text(), vec(some_text(), 1..3), any::<u64>()).prop_map(|(folder, files, max_bytes)| {
        v1::KeptTrace {
            folder,
            files,
            max_bytes,
        }
    })
}

/// Where a job's output was kept (JobEvent field 14).
fn kept_output() -> impl Strategy<Value = v1::KeptOutput> {
    (some_text(), vec(some_text(), 1..3), any::<u64>()).prop_map(|(folder, files, max_bytes)| {
        v1::KeptOutput {
            folder,
            files,
            max_bytes,
        }
    })
}

fn accounting_tick() -> impl Strategy<Value = v1::AccountingTick> {
    (
        (
            some_text(),
            job_id(),
            some_text(),
            option::of(some_text()),
            some_text(),
        ),
        (
            1u32..,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
        ),
        (
            timestamp(),
            timestamp(),
            0i64..,
            any::<bool>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (tick_id, job_id, user, project, product_id),
                (replicas, cpu, memory_gib, gpu, exclusive_nodes),
                rest,
            )| {
                let (start, end, duration_ms, r#final, sequence) = rest;
                v1::AccountingTick {
                    tick_id,
                    job_id,
                    user,
                    project,
                    product_id,
                    replicas,
                    cpu,
                    memory_gib,
                    gpu,
                    interval_start: Some(start),
                    interval_end: Some(end),
                    duration_ms,
                    r#final,
                    sequence,
                    exclusive_nodes,
                }
            },
        )
}

fn proxy_event() -> impl Strategy<Value = v1::ProxyEvent> {
    let target = (any::<u32>(), ip_address(), port(), dns_subdomain()).prop_map(
        |(rank, pod_ip, port, hostname)| v1::ProxyTarget {
            rank,
            pod_ip,
            port,
            hostname,
        },
    );
    (
        some_text(),
        job_id(),
        1i32..=3,
        vec(target, 1..3),
        vec(dns_subdomain(), 0..3),
        timestamp(),
        any::<u64>(),
    )
        .prop_map(
            |(event_id, job_id, action, targets, domains, ts, sequence)| v1::ProxyEvent {
                event_id,
                job_id,
                action,
                targets,
                domains,
                timestamp: Some(ts),
                sequence,
            },
        )
}

fn open_session() -> impl Strategy<Value = v1::OpenSession> {
    (
        job_id(),
        any::<u32>(),
        1i32..=3,
        option::of(time_allocation()),
    )
        .prop_map(|(job_id, rank, kind, lifetime)| v1::OpenSession {
            job_id,
            rank,
            kind,
            lifetime,
        })
}

fn session_reply() -> impl Strategy<Value = v1::SessionReply> {
    use v1::session_reply::Result as Outcome;
    let opened = ("[a-z0-9]{1,8}", timestamp()).prop_map(|(host, t)| {
        Outcome::Opened(v1::OpenedSession {
            url: format!("https://{host}.example.org/.volcano-runner/session?token=x"),
            expires_at: Some(t),
        })
    });
    let refused = ("[a-z_]{1,16}", some_text())
        .prop_map(|(reason, message)| Outcome::Refused(v1::SessionRefusal { reason, message }));
    (
        job_id(),
        any::<u32>(),
        1i32..=3,
        prop_oneof![opened, refused],
    )
        .prop_map(|(job_id, rank, kind, result)| v1::SessionReply {
            job_id,
            rank,
            kind,
            result: Some(result),
        })
}

fn any_message() -> impl Strategy<Value = AnyMessage> {
    prop_oneof![
        submit_job().prop_map(AnyMessage::SubmitJob),
        cancel_job().prop_map(AnyMessage::CancelJob),
        extend_job().prop_map(AnyMessage::ExtendJob),
        job_event().prop_map(AnyMessage::JobEvent),
        accounting_tick().prop_map(AnyMessage::AccountingTick),
        proxy_event().prop_map(AnyMessage::ProxyEvent),
        open_session().prop_map(AnyMessage::OpenSession),
        session_reply().prop_map(AnyMessage::SessionReply),
    ]
}

// ---------------------------------------------------------------------------------------------------
// Strategies for hostile input.

/// Field names of the contract, so arbitrary JSON reaches past the first unknown-field check.
const KEYS: &[&str] = &[
    "jobId",
    "owner",
    "user",
    "project",
    "application",
    "name",
    "version",
    "image",
    "invocation",
    "environment",
    "parameters",
    "type",
    "options",
    "min",
    "max",
    "product",
    "cpu",
    "memoryGib",
    "replicas",
    "timeAllocation",
    "resources",
    "file",
    "path",
    "peer",
    "hostname",
    "text",
    "integer",
    "floatingPoint",
    "enumeration",
    "networkIp",
    "openPorts",
    "extension",
    "requestId",
    "state",
    "timestamp",
    "targets",
    "action",
    "word",
    "var",
    "variableNames",
    "boolFlag",
    "env",
];

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        finite().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        prop_oneof![
            Just("3600s"),
            Just("-1s"),
            Just("2026-11-22T09:15:02+00:00"),
            Just("APPLICATION_TYPE_WEB"),
            Just("PARAMETER_TYPE_INTEGER"),
            Just("NaN"),
            Just("Infinity"),
            Just("18446744073709551616"),
            Just("/a/../b"),
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    let key = prop_oneof![
        proptest::sample::select(KEYS).prop_map(str::to_owned),
        ".{0,6}"
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn examples() -> &'static [(MessageType, Value)] {
    static E: OnceLock<Vec<(MessageType, Value)>> = OnceLock::new();
    E.get_or_init(|| {
        support::examples()
            .into_iter()
            .map(|(path, t)| (t, support::read_json(&path)))
            .collect()
    })
}

/// The JSON pointers of every value inside `v`, the root included.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                pointers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// One random change to a document.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value with arbitrary JSON.
    Replace(Value),
    /// Remove the member or element.
    Remove,
    /// Keep the type but make the value nasty: splice a fragment into a string, or swap a number for a
    /// boundary value. These edits mostly still decode, so they reach the validator.
    Tweak(Index, Index),
}

/// Fragments that break rules: path traversal, case, separators, control characters, length.
const FRAGMENTS: &[&str] = &[
    "/../",
    "..",
    "/.",
    "A",
    " ",
    "_",
    "-",
    ":",
    "@",
    "/",
    "",
    "\u{0}",
    "\n",
    "é",
    "$(X)",
    "0123456789012345678901234567890123456789012345678901234567890123",
];
const NUMBERS: &[i64] = &[
    0,
    -1,
    1,
    65535,
    65536,
    4_294_967_295,
    4_294_967_296,
    i64::MAX,
    i64::MIN,
];

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => arbitrary_json().prop_map(Edit::Replace),
        1 => Just(Edit::Remove),
        6 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::Tweak(a, b)),
    ]
}

fn apply(doc: &mut Value, pointer: &str, edit: Edit) {
    match edit {
        Edit::Replace(new) => {
            if let Some(slot) = doc.pointer_mut(pointer) {
                *slot = new;
            }
        }
        Edit::Remove => {
            let Some((parent, last)) = pointer.rsplit_once('/') else {
                return;
            };
            match doc.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(&last.replace("~1", "/").replace("~0", "~"));
                }
                Some(Value::Array(a)) => {
                    if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < a.len()) {
                        a.remove(i);
                    }
                }
                _ => {}
            }
        }
        Edit::Tweak(what, at) => match doc.pointer_mut(pointer) {
            Some(Value::String(s)) => {
                let fragment = *what.get(FRAGMENTS);
                let boundaries: Vec<usize> =
                    s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
                s.insert_str(*at.get(&boundaries), fragment);
            }
            Some(slot @ Value::Number(_)) => *slot = Value::from(*what.get(NUMBERS)),
            Some(Value::Bool(b)) => *b = !*b,
            _ => {}
        },
    }
}

/// An example with one to three random edits.
fn mutated_example() -> impl Strategy<Value = (MessageType, Value)> {
    (any::<Index>(), vec((any::<Index>(), edit()), 1..4)).prop_map(|(which, edits)| {
        let (t, mut doc) = examples()[which.index(examples().len())].clone();
        for (at, edit) in edits {
            let mut all = Vec::new();
            pointers(&doc, String::new(), &mut all);
            // Tweaks only make sense on scalars; aim them there.
            if matches!(edit, Edit::Tweak(..)) {
                all.retain(|p| {
                    doc.pointer(p)
                        .is_some_and(|v| !v.is_object() && !v.is_array())
                });
            }
            if all.is_empty() {
                continue;
            }
            let pointer = at.get(&all).clone();
            apply(&mut doc, &pointer, edit);
        }
        (t, doc)
    })
}

/// Decodes, validates and (when valid) re-encodes; the invariant: a message that passes validation
/// encodes to JSON, and that JSON satisfies the schema.
fn check_hostile(
    message_type: MessageType,
    format: Format,
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    let _ = messages::peek_job_id(format, bytes);
    let _ = messages::decode_inbound(
        Some(message_type.amqp_type()),
        Some(format.content_type()),
        bytes,
    );
    let Ok(message) = messages::decode_any(message_type, format, bytes) else {
        return Ok(());
    };
    if validate::message(&message, config()).is_err() {
        return Ok(());
    }
    let json = message
        .encode(Format::Json)
        .map_err(|e| TestCaseError::fail(format!("a valid message does not encode: {e}")))?;
    let value: Value = serde_json::from_slice(&json).unwrap();
    let errors = support::schema_errors(&validators()[&message_type], &value);
    prop_assert!(
        errors.is_empty(),
        "valid but outside the schema: {errors:?}\n{value}"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Generated messages serialise to JSON that the schema accepts, and come back unchanged from JSON
    /// and from protobuf.
    #[test]
    fn generated_messages_fit_the_schema_and_round_trip(message in any_message()) {
        let t = message.message_type();
        let json = message.encode(Format::Json).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let value: Value = serde_json::from_slice(&json).unwrap();
        let errors = support::schema_errors(&validators()[&t], &value);
        prop_assert!(errors.is_empty(), "{errors:?}\n{value}");
        prop_assert_eq!(&messages::decode_any(t, Format::Json, &json).unwrap(), &message);
        let protobuf = message.encode(Format::Protobuf).unwrap();
        prop_assert_eq!(&messages::decode_any(t, Format::Protobuf, &protobuf).unwrap(), &message);
    }

    /// Arbitrary bytes, read as any message in either format, never panic the decoder or validator.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        for t in MessageType::ALL {
            for format in Format::ALL {
                check_hostile(t, format, &bytes)?;
            }
        }
    }

    /// Arbitrary JSON documents, read as any message, never panic the decoder or validator.
    #[test]
    fn arbitrary_json_never_panics(doc in arbitrary_json()) {
        let bytes = serde_json::to_vec(&doc).unwrap();
        for t in MessageType::ALL {
            check_hostile(t, Format::Json, &bytes)?;
        }
    }

    /// Examples with values replaced or removed at random never panic the decoder or the validator, and
    /// whatever still passes validation stays inside the schema. Protobuf re-encodings of the same
    /// documents, truncated at a random point, never panic either.
    #[test]
    fn mutated_examples_never_panic((t, doc) in mutated_example(), cut in any::<Index>()) {
        let bytes = serde_json::to_vec(&doc).unwrap();
        check_hostile(t, Format::Json, &bytes)?;
        if let Ok(message) = messages::decode_any(t, Format::Json, &bytes)
            && let Ok(protobuf) = message.encode(Format::Protobuf)
        {
            let end = cut.index(protobuf.len() + 1);
            check_hostile(t, Format::Protobuf, &protobuf[..end])?;
        }
    }

    /// The parser accepts every reference the grammar generates.
    #[test]
    fn image_parser_accepts_the_grammar(reference in image_reference()) {
        prop_assert!(
            validate::image::parse(&reference).is_ok(),
            "{reference}: {:?}", validate::image::parse(&reference)
        );
        prop_assert!(image_pattern().is_valid(&Value::String(reference.clone())), "{reference}");
    }

    /// Whatever the parser accepts, the schema's image pattern accepts too, so a message that passes
    /// validation never fails the schema on its image.
    #[test]
    fn image_parser_is_no_looser_than_the_schema(reference in "[a-zA-Z0-9._:/@\\[\\]-]{0,40}") {
        if validate::image::parse(&reference).is_ok() {
            prop_assert!(image_pattern().is_valid(&Value::String(reference.clone())), "{reference}");
        }
    }
}

fn image_pattern() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let schema = support::schema(MessageType::SubmitJob);
        support::validator_for(&schema["$defs"]["ImageReference"])
    })
}

/// Numbers that only protobuf can carry (any i64 seconds, negative nanos, unknown enum numbers, any u32)
/// placed into the examples.
fn protobuf_extremes() -> impl Strategy<Value = AnyMessage> {
    // Integer strategies do not favour the edges, so name them.
    let seconds = || {
        prop_oneof![
            any::<i64>(),
            Just(i64::MIN),
            Just(i64::MAX),
            Just(0),
            -320_000_000_000i64..=320_000_000_000,
        ]
    };
    let nanos = || prop_oneof![any::<i32>(), Just(i32::MIN), Just(-1), 0i32..1_000_000_001];
    let ts = (seconds(), nanos()).prop_map(|(seconds, nanos)| Timestamp { seconds, nanos });
    let du = (seconds(), nanos()).prop_map(|(seconds, nanos)| Duration { seconds, nanos });
    (
        any::<Index>(),
        (
            option::of(ts.clone()),
            option::of(du.clone()),
            option::of(ts),
        ),
        (
            any::<u32>(),
            any::<u32>(),
            any::<i32>(),
            any::<i32>(),
            any::<i32>(),
        ),
        (
            option::of(any::<u32>()),
            option::of(any::<i64>()),
            option::of(any::<f64>()),
        ),
        option::of(du),
    )
        .prop_map(
            |(which, (t1, d, t2), (n, port, e1, e2, e3), (w, int, float), ext)| {
                let (message_type, doc) = &examples()[which.index(examples().len())];
                let bytes = serde_json::to_vec(doc).unwrap();
                let mut message =
                    messages::decode_any(*message_type, Format::Json, &bytes).unwrap();
                match &mut message {
                    AnyMessage::SubmitJob(j) => {
                        j.submitted_at = t1;
                        j.time_allocation = d;
                        j.replicas = n;
                        let app = j.application.as_mut().unwrap();
                        app.application_type = e1;
                        app.web_port = w;
                        if let Some(p) = app.parameters.first_mut() {
                            p.r#type = e2;
                            p.min = float;
                        }
                        if let Some(v) = j.parameters.values_mut().next() {
                            v.value = int.map(v1::parameter_value::Value::Integer);
                        }
                        j.resources.push(v1::ResourceValue {
                            value: Some(v1::resource_value::Value::NetworkIp(v1::NetworkIpValue {
                                id: "ip".into(),
                                ip_address: "10.0.0.1".into(),
                                open_ports: vec![v1::PortRange {
                                    start: port,
                                    end: port,
                                    protocol: e3,
                                }],
                            })),
                        });
                    }
                    AnyMessage::ExtendJob(x) => x.extension = ext,
                    AnyMessage::CancelJob(_) => {}
                    AnyMessage::JobEvent(x) => {
                        x.state = e1;
                        x.timestamp = t1;
                        x.expires_at = t2;
                    }
                    AnyMessage::AccountingTick(x) => {
                        x.interval_start = t1;
                        x.interval_end = t2;
                        x.replicas = n;
                        x.duration_ms = int.unwrap_or_default();
                    }
                    AnyMessage::ProxyEvent(x) => {
                        x.action = e1;
                        x.timestamp = t1;
                        if let Some(t) = x.targets.first_mut() {
                            t.port = port;
                        }
                    }
                    AnyMessage::OpenSession(x) => {
                        x.kind = e1;
                        x.rank = n;
                        x.lifetime = ext;
                    }
                    AnyMessage::SessionReply(x) => {
                        x.kind = e1;
                        if let Some(v1::session_reply::Result::Opened(o)) = &mut x.result {
                            o.expires_at = t1;
                        }
                    }
                }
                message
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Extreme numbers and unknown enum numbers never panic the validator, and whatever passes it still
    /// encodes to JSON inside the schema.
    #[test]
    fn protobuf_extremes_never_panic(message in protobuf_extremes()) {
        let bytes = message.encode(Format::Protobuf).unwrap();
        check_hostile(message.message_type(), Format::Protobuf, &bytes)?;
    }
}
