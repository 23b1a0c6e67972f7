//! The message contract holds together: the examples, the JSON Schemas, the protobuf descriptors compiled
//! from `proto/`, the decoder and the validator all agree, and the invalid fixtures are rejected with
//! the field they break.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use serde::Deserialize;
use serde_json::Value;
use volcano_runner::messages::{self, AnyMessage, Format, MessageType, v1};
use volcano_runner::validate;

use support::{examples, read_json, root, schema, schema_errors, test_config, validator};

/// Every example is valid against its message's JSON Schema (draft 2020-12, formats checked).
#[test]
fn examples_validate_against_their_schemas() {
    let mut problems = Vec::new();
    for (path, message_type) in examples() {
        let errors = schema_errors(&validator(message_type), &read_json(&path));
        problems.extend(
            errors
                .into_iter()
                .map(|e| format!("{}: {e}", path.display())),
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every example decodes into its prost type, passes validation, survives protobuf encoding, and
/// re-encodes to exactly the JSON it was read from (the examples are in canonical proto3 JSON form).
#[test]
fn examples_decode_validate_and_round_trip() {
    let config = test_config();
    for (path, message_type) in examples() {
        let name = path.display();
        let bytes = std::fs::read(&path).unwrap();
        let message = messages::decode_any(message_type, Format::Json, &bytes)
            .unwrap_or_else(|e| panic!("{name}: does not decode: {e}"));
        validate::message(&message, &config).unwrap_or_else(|e| panic!("{name}: invalid: {e}"));

        let protobuf = message.encode(Format::Protobuf).unwrap();
        let back = messages::decode_any(message_type, Format::Protobuf, &protobuf)
            .unwrap_or_else(|e| panic!("{name}: protobuf does not decode: {e}"));
        assert_eq!(
            back, message,
            "{name}: protobuf round trip changed the message"
        );

        let json = message.encode(Format::Json).unwrap();
        let reencoded: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            reencoded,
            read_json(&path),
            "{name}: re-encoding changed the JSON"
        );
    }
}

/// The job id limit is one number: every inbound schema's `JobId` has the validator's maximum, and ids
/// at and one past it are accepted and refused alike by the schema and by validation. Events that reject
/// a message may name any readable id, as the message had it.
#[test]
fn the_job_id_limit_is_the_same_in_schemas_and_validation() {
    let max = validate::JOB_ID_MAX;
    for message_type in [
        MessageType::SubmitJob,
        MessageType::CancelJob,
        MessageType::ExtendJob,
    ] {
        let schema = schema(message_type);
        let job_id = &schema["$defs"]["JobId"];
        assert_eq!(
            job_id["maxLength"].as_u64(),
            Some(max as u64),
            "{message_type:?}: JobId maxLength"
        );
        let check = support::validator_for(job_id);
        let id = |n: usize| Value::String("7".repeat(n));
        assert!(
            check.is_valid(&id(max)),
            "{message_type:?}: {max} characters fit"
        );
        assert!(
            !check.is_valid(&id(max + 1)),
            "{message_type:?}: {} do not",
            max + 1
        );
    }
    assert_eq!(validate::job_id(&"7".repeat(max)), Ok(()));
    assert!(validate::job_id(&"7".repeat(max + 1)).is_err());
    let event = schema(MessageType::JobEvent);
    assert_eq!(
        event["$defs"]["JobId"]["maxLength"].as_u64(),
        Some(validate::READABLE_JOB_ID_MAX as u64)
    );
}

/// The examples' message ids are the ones the runner makes: `<jobId>/<STATE>` for a transition,
/// `<jobId>/status/<16 hex>` for a pending status, `<jobId>/refund/<attempt>` for a refund, `<jobId>/proxy/<action>/<generation>`, `<jobId>/<n>`
/// for the n-th tick.
#[test]
fn example_ids_follow_the_runtime_scheme() {
    use volcano_runner::durable::ids;
    let mut checked = 0;
    for (path, message_type) in examples() {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.display();
        match messages::decode_any(message_type, Format::Json, &bytes).unwrap() {
            AnyMessage::JobEvent(e) => {
                let state = v1::JobState::try_from(e.state).unwrap();
                if state == v1::JobState::Unspecified && e.refundable_ms > 0 {
                    let attempt = e
                        .event_id
                        .strip_prefix(&format!("{}/refund/", e.job_id))
                        .and_then(|a| a.parse::<i32>().ok())
                        .unwrap_or_else(|| panic!("{name}: {}", e.event_id));
                    assert_eq!(e.event_id, ids::refund(&e.job_id, attempt), "{name}");
                } else if state == v1::JobState::Unspecified && e.reason == "booked" {
                    let start = e.booking.as_ref().and_then(|b| b.start_at).unwrap();
                    let ms = start.seconds * 1000 + i64::from(start.nanos) / 1_000_000;
                    assert_eq!(e.event_id, ids::booked(&e.job_id, ms), "{name}");
                } else if state == v1::JobState::Unspecified {
                    let hash = e
                        .event_id
                        .strip_prefix(&format!("{}/status/", e.job_id))
                        .unwrap_or_else(|| panic!("{name}: {}", e.event_id));
                    assert!(
                        hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()),
                        "{name}: {}",
                        e.event_id
                    );
                } else {
                    assert_eq!(e.event_id, ids::transition(&e.job_id, state), "{name}");
                }
            }
            AnyMessage::ProxyEvent(p) => {
                let action = match v1::ProxyAction::try_from(p.action).unwrap() {
                    v1::ProxyAction::Create => "create",
                    v1::ProxyAction::Update => "update",
                    v1::ProxyAction::Remove => "remove",
                    v1::ProxyAction::Unspecified => "unspecified",
                };
                let prefix = format!("{}/proxy/{action}/", p.job_id);
                let generation = p.event_id.strip_prefix(&prefix);
                assert!(
                    generation.is_some_and(|g| g.parse::<u64>().is_ok()),
                    "{name}: {}",
                    p.event_id
                );
            }
            AnyMessage::AccountingTick(t) => {
                assert_eq!(t.tick_id, format!("{}/{}", t.job_id, t.sequence), "{name}");
            }
            _ => continue,
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} outbound examples");
}

/// No free text is unbounded: in every example submission, every string made one character longer than
/// validation's bound for its field is refused by the JSON Schema (at that field) and by validation
/// (naming that field), so schema and validation bound the same fields.
#[test]
fn every_string_of_a_submission_is_bounded_in_schema_and_validation() {
    let config = test_config();
    let schema = validator(MessageType::SubmitJob);
    let mut checked = 0;
    for (path, message_type) in examples() {
        if message_type != MessageType::SubmitJob {
            continue;
        }
        let example = read_json(&path);
        let mut leaves = Vec::new();
        string_leaves(&example, String::new(), String::new(), &mut leaves);
        for (field, pointer) in leaves {
            if field == "jobId" {
                continue; // its own limit, held by the_job_id_limit_is_the_same_in_schemas_and_validation
            }
            let max = validate::text::submit_limit(&field);
            let mut long = example.clone();
            *long.pointer_mut(&pointer).unwrap() = Value::String("a".repeat(max + 1));
            // Enumerations, times, durations and 64-bit integers are strings in JSON, not free text.
            let Ok(job) = serde_json::from_value::<v1::SubmitJob>(long.clone()) else {
                continue;
            };
            let at_field = schema
                .iter_errors(&long)
                .any(|e| e.instance_path().to_string() == pointer);
            assert!(
                at_field,
                "{}: {field} is not bounded by the schema",
                path.display()
            );
            let e = validate::submit(&job, &config).unwrap_err();
            assert_eq!(e.field(), field, "{}: {e}", path.display());
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} strings checked");
}

/// A booked start needs a time limit and no whole nodes, in the schema as in validation: the booked
/// example without `timeAllocation`, or with `exclusiveNodes`, is refused by both.
#[test]
fn booked_starts_need_a_time_limit_and_no_whole_nodes_in_schema_and_validation() {
    let config = test_config();
    let schema = validator(MessageType::SubmitJob);
    let example = read_json(&root().join("schemas/examples/submit-job.booked.json"));
    assert!(example.get("startWindow").is_some());
    let mut untimed = example.clone();
    untimed.as_object_mut().unwrap().remove("timeAllocation");
    let mut whole = example.clone();
    whole["exclusiveNodes"] = Value::Bool(true);
    for (bad, field) in [(untimed, "timeAllocation"), (whole, "startWindow")] {
        assert!(!schema.is_valid(&bad), "{field}: the schema accepts it");
        let job: v1::SubmitJob = serde_json::from_value(bad).unwrap();
        let e = validate::submit(&job, &config).unwrap_err();
        assert_eq!(e.field(), field, "{e}");
    }
}

/// A whole-node job needs a time limit, in the schema as in validation: every example submission with
/// `exclusiveNodes` and without `timeAllocation` is refused by both, naming `timeAllocation`; with its
/// time limit, or without whole nodes, both accept it.
#[test]
fn whole_nodes_need_a_time_limit_in_schema_and_validation() {
    let config = test_config();
    let schema = validator(MessageType::SubmitJob);
    let mut checked = 0;
    for (path, message_type) in examples() {
        if message_type != MessageType::SubmitJob {
            continue;
        }
        let mut example = read_json(&path);
        // Whole-node jobs cannot be booked (both refuse a start window with them).
        example.as_object_mut().unwrap().remove("startWindow");
        example["exclusiveNodes"] = Value::Bool(true);
        example["timeAllocation"] = Value::String("3600s".into());
        let timed: v1::SubmitJob = serde_json::from_value(example.clone()).unwrap();
        assert!(schema.is_valid(&example), "{}", path.display());
        assert_eq!(
            validate::submit(&timed, &config),
            Ok(()),
            "{}",
            path.display()
        );
        example.as_object_mut().unwrap().remove("timeAllocation");
        let errors: Vec<String> = schema
            .iter_errors(&example)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.iter().any(|e| e.contains("timeAllocation")),
            "{}: the schema accepts a whole-node job without a time limit: {errors:?}",
            path.display()
        );
        let forever: v1::SubmitJob = serde_json::from_value(example.clone()).unwrap();
        let e = validate::submit(&forever, &config).unwrap_err();
        assert_eq!(e.field(), "timeAllocation", "{}: {e}", path.display());
        example["exclusiveNodes"] = Value::Bool(false);
        assert!(schema.is_valid(&example), "{}", path.display());
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} examples");
}

/// `(field path as validation names it, JSON pointer)` of every string in `value`.
fn string_leaves(value: &Value, field: String, pointer: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(_) => out.push((field, pointer)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_leaves(item, format!("{field}[{i}]"), format!("{pointer}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let f = if field.is_empty() {
                    key.clone()
                } else {
                    format!("{field}.{key}")
                };
                let escaped = key.replace('~', "~0").replace('/', "~1");
                string_leaves(item, f, format!("{pointer}/{escaped}"), out);
            }
        }
        _ => {}
    }
}

/// One bound on time allocations, in the schemas and in validation: for a submission's `timeAllocation`
/// and an extension, every duration around each digit boundary of the pattern and around 100 years
/// (36,600 days) is accepted by the schema exactly when validation accepts it, in canonical form and
/// with leading zeros or trailing zero decimals.
#[test]
fn the_time_allocation_bound_is_the_same_in_schemas_and_validation() {
    let config = test_config();
    let max = validate::TIME_ALLOCATION_MAX_SECONDS;
    let mut seconds: Vec<i64> = vec![0, 1, max - 1, max, max + 1, 315_576_000_000];
    for digits in 1..=11 {
        let p = 10i64.pow(digits);
        seconds.extend([p - 1, p, p + 1]);
    }
    // Each prefix of 3162240000 with the next digit one higher: the branches of the pattern.
    let text = max.to_string();
    for i in 1..text.len() {
        let mut higher: Vec<u8> = text.as_bytes().to_vec();
        if higher[i] < b'9' {
            higher[i] += 1;
            seconds.push(String::from_utf8(higher).unwrap().parse().unwrap());
        }
        let mut lower: Vec<u8> = text.as_bytes().to_vec();
        if lower[i] > b'0' {
            lower[i] -= 1;
            seconds.push(String::from_utf8(lower).unwrap().parse().unwrap());
        }
    }
    let submit_schema = validator(MessageType::SubmitJob);
    let extend_schema = validator(MessageType::ExtendJob);
    let figlet = read_json(&root().join("schemas/examples/submit-job.figlet.json"));
    let extend = read_json(&root().join("schemas/examples/extend-job.json"));
    let mut checked = 0;
    for s in seconds {
        for nanos in [0, 1, 500_000_000, 999_999_999] {
            let duration = pbjson_types::Duration { seconds: s, nanos };
            let canonical = serde_json::to_value(duration).unwrap();
            let canonical = canonical.as_str().unwrap().to_owned();
            let mut forms = vec![canonical.clone(), format!("00{canonical}")];
            if nanos == 0 {
                forms.push(format!("{s}.000s"));
            }
            for form in forms {
                let mut job = figlet.clone();
                job["timeAllocation"] = Value::String(form.clone());
                let decoded: v1::SubmitJob = serde_json::from_value(job.clone()).unwrap();
                let verdict = validate::submit(&decoded, &config);
                assert_eq!(
                    submit_schema.is_valid(&job),
                    verdict.is_ok(),
                    "timeAllocation {form}: validation says {verdict:?}"
                );
                if let Err(e) = verdict {
                    assert_eq!(e.field(), "timeAllocation", "{form}: {e}");
                }
                let mut ext = extend.clone();
                ext["extension"] = Value::String(form.clone());
                let decoded: v1::ExtendJob = serde_json::from_value(ext.clone()).unwrap();
                let verdict = validate::extend(&decoded);
                assert_eq!(
                    extend_schema.is_valid(&ext),
                    verdict.is_ok(),
                    "extension {form}: validation says {verdict:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "only {checked} durations");
}

/// Map keys (parameter names, environment variable names) have validation's bound in the schema too:
/// 256 characters pass both, 257 are refused by both, naming the key.
#[test]
fn map_keys_are_bounded_in_schema_and_validation() {
    let config = test_config();
    let schema = validator(MessageType::SubmitJob);
    let example = read_json(&root().join("schemas/examples/submit-job.matlab-web.json"));
    let max = validate::text::NAME_MAX;
    for n in [max, max + 1] {
        let name = "L".repeat(n);
        // An environment variable under a long name.
        let mut job = example.clone();
        let env = job["application"]["environment"].as_object_mut().unwrap();
        let template = env.remove("MLM_LICENSE_FILE").unwrap();
        env.insert(name.clone(), template);
        let decoded: v1::SubmitJob = serde_json::from_value(job.clone()).unwrap();
        let verdict = validate::submit(&decoded, &config);
        assert_eq!(schema.is_valid(&job), n == max, "environment {n}");
        assert_eq!(verdict.is_ok(), n == max, "environment {n}: {verdict:?}");
        if let Err(e) = verdict {
            assert_eq!(e.field(), format!("application.environment.{name}"));
        }
        // A parameter value under a long name (refused for its length before it is looked up).
        let mut job = example.clone();
        let values = job["parameters"].as_object_mut().unwrap();
        let value = values.remove("workspace").unwrap();
        values.insert(name.clone(), value);
        let decoded: v1::SubmitJob = serde_json::from_value(job.clone()).unwrap();
        let e = validate::submit(&decoded, &config).unwrap_err();
        assert_eq!(
            schema.is_valid(&job),
            n == max,
            "parameter name of {n} characters"
        );
        if n > max {
            assert_eq!(e.field(), format!("parameters.{name}"));
            assert!(e.message().contains("at most 256"), "{e}");
        } else {
            assert_eq!(e.reason(), "unknown_parameter", "{e}");
        }
    }
}

/// `null` for a field is the field's default, as the proto3 JSON mapping says (and the README): in every
/// inbound example, each member of each message object set to `null` decodes to the message without
/// that member, whatever the field's type (scalar, enum, message, list, map, oneof member). A `null` for
/// an unknown field, in a list, or as a map value is still refused.
#[test]
fn null_for_a_field_is_its_default() {
    fn members(v: &Value, at: String, maps: &[&str], out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (key, item) in map {
                    let pointer = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    if !maps.contains(&at.as_str()) {
                        out.push(pointer.clone());
                    }
                    members(item, pointer, maps, out);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    members(item, format!("{at}/{i}"), maps, out);
                }
            }
            _ => {}
        }
    }
    // The members of these objects are map entries, not fields.
    let maps = ["/parameters", "/application/environment"];
    let mut checked = 0;
    for (path, message_type) in examples() {
        if !message_type.is_inbound() {
            continue;
        }
        let example = read_json(&path);
        let mut pointers = Vec::new();
        members(&example, String::new(), &maps, &mut pointers);
        for pointer in pointers {
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let mut with_null = example.clone();
            *with_null.pointer_mut(&pointer).unwrap() = Value::Null;
            let mut without = example.clone();
            let parent_value = if parent.is_empty() {
                &mut without
            } else {
                without.pointer_mut(parent).unwrap()
            };
            let key = key.replace("~1", "/").replace("~0", "~");
            parent_value.as_object_mut().unwrap().remove(&key);
            let expected = messages::decode_any(
                message_type,
                Format::Json,
                &serde_json::to_vec(&without).unwrap(),
            )
            .unwrap_or_else(|e| panic!("{}: without {pointer}: {e}", path.display()));
            let got = messages::decode_any(
                message_type,
                Format::Json,
                &serde_json::to_vec(&with_null).unwrap(),
            )
            .unwrap_or_else(|e| panic!("{}: {pointer} = null: {e}", path.display()));
            assert_eq!(got, expected, "{}: {pointer} = null", path.display());
            checked += 1;
        }
    }
    assert!(checked > 60, "only {checked} fields set to null");

    let refused = |doc: Value| {
        messages::decode_any(
            MessageType::SubmitJob,
            Format::Json,
            &serde_json::to_vec(&doc).unwrap(),
        )
        .unwrap_err()
    };
    let figlet = read_json(&root().join("schemas/examples/submit-job.figlet.json"));
    let mut unknown = figlet.clone();
    unknown["replica"] = Value::Null;
    let e = refused(unknown);
    assert!(e.to_string().contains("unknown field `replica`"), "{e}");
    let mut in_list = figlet.clone();
    in_list["application"]["invocation"]
        .as_array_mut()
        .unwrap()
        .push(Value::Null);
    assert_eq!(refused(in_list).reason(), "invalid_json");
    let mut map_value = figlet.clone();
    map_value["parameters"]["text"] = Value::Null;
    let e = refused(map_value);
    assert_eq!(e.field(), Some("parameters.text"), "{e}");
    // Another problem behind a null is the one reported, with its field.
    let mut both = figlet;
    both["exclusiveNodes"] = Value::Null;
    both["replicas"] = Value::String("two".into());
    let e = refused(both);
    assert_eq!(e.field(), Some("replicas"), "{e}");
}

/// Each message has a schema file and at least one example, and no schema file is a stray.
#[test]
fn every_message_has_a_schema_and_an_example() {
    let with_examples: BTreeSet<MessageType> = examples().into_iter().map(|(_, t)| t).collect();
    for message_type in MessageType::ALL {
        assert!(
            support::schema_path(message_type).is_file(),
            "no schema for {message_type}"
        );
        assert!(
            with_examples.contains(&message_type),
            "no example for {message_type}"
        );
    }
    let schema_files: Vec<_> = std::fs::read_dir(root().join("schemas"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".schema.json"))
        .collect();
    assert_eq!(
        schema_files.len(),
        MessageType::ALL.len(),
        "{schema_files:?}"
    );
}

/// The examples the contract promises exist: a figlet-like batch job, a 2-node MPI-style job with input
/// files and an output folder, and an interactive web application with a peer and a license server.
#[test]
fn promised_examples_exist() {
    let submits: Vec<v1::SubmitJob> = examples()
        .into_iter()
        .filter(|(_, t)| *t == MessageType::SubmitJob)
        .map(|(p, _)| messages::decode(Format::Json, &std::fs::read(p).unwrap()).unwrap())
        .collect();
    let app = |j: &v1::SubmitJob| j.application.clone().unwrap_or_default();
    let has_value = |j: &v1::SubmitJob, f: fn(&v1::parameter_value::Value) -> bool| {
        j.parameters
            .values()
            .filter_map(|v| v.value.as_ref())
            .any(f)
    };
    use v1::parameter_value::Value as V;
    assert!(submits.iter().any(|j| j.replicas == 1
        && app(j).application_type == v1::ApplicationType::Batch as i32
        && app(j).image.contains("figlet")));
    assert!(submits.iter().any(|j| j.replicas == 2
        && has_value(j, |v| matches!(v, V::File(_)))
        && j.output_folder.is_some()));
    assert!(submits.iter().any(
        |j| app(j).application_type == v1::ApplicationType::Web as i32
            && has_value(j, |v| matches!(v, V::Peer(_)))
            && has_value(j, |v| matches!(v, V::LicenseServer(_)))
    ));
}

// ---------------------------------------------------------------------------------------------------
// Drift between proto and schema.

/// Every field of every message reachable from each top-level message appears in the schema under its
/// proto3 JSON name with a matching JSON type (and enum names), and the schema has no property that is
/// not a field. A field added to the proto and not to the schema fails here.
#[test]
fn schemas_match_the_proto_descriptors() {
    let descriptors = Descriptors::load();
    let mut problems = Vec::new();
    for message_type in MessageType::ALL {
        problems.extend(drift(&descriptors, message_type, &schema(message_type)));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The drift check itself finds a missing field, an extra property, a wrong type and a missing enum
/// value, so that a passing drift test means something.
#[test]
fn drift_check_detects_each_kind_of_mismatch() {
    let descriptors = Descriptors::load();
    let base = schema(MessageType::SubmitJob);
    assert!(drift(&descriptors, MessageType::SubmitJob, &base).is_empty());

    let broken = |edit: fn(&mut Value)| {
        let mut s = base.clone();
        edit(&mut s);
        drift(&descriptors, MessageType::SubmitJob, &s).join("\n")
    };
    let found = broken(|s| {
        s["$defs"]["Product"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("gpu");
    });
    assert!(found.contains("volcano_runner.v1.Product.gpu"), "{found}");
    let found = broken(|s| s["properties"]["jobNmae"] = serde_json::json!({"type": "string"}));
    assert!(found.contains("jobNmae"), "{found}");
    let found = broken(|s| s["properties"]["replicas"] = serde_json::json!({"type": "string"}));
    assert!(found.contains("replicas"), "{found}");
    let found = broken(|s| {
        s["$defs"]["PortRange"]["properties"]["protocol"]["enum"] =
            serde_json::json!(["PROTOCOL_TCP"]);
    });
    assert!(found.contains("PROTOCOL_UDP"), "{found}");
}

struct Descriptors {
    messages: BTreeMap<String, DescriptorProto>,
    enums: BTreeMap<String, EnumDescriptorProto>,
}

impl Descriptors {
    fn load() -> Self {
        let set = FileDescriptorSet::decode(messages::FILE_DESCRIPTOR_SET).unwrap();
        let mut d = Descriptors {
            messages: BTreeMap::new(),
            enums: BTreeMap::new(),
        };
        for file in set.file {
            let prefix = format!(".{}", file.package());
            for m in file.message_type {
                d.add_message(&prefix, m);
            }
            for e in file.enum_type {
                d.enums.insert(format!("{prefix}.{}", e.name()), e);
            }
        }
        d
    }

    fn add_message(&mut self, prefix: &str, m: DescriptorProto) {
        let name = format!("{prefix}.{}", m.name());
        for nested in m.nested_type.clone() {
            self.add_message(&name, nested);
        }
        for e in m.enum_type.clone() {
            self.enums.insert(format!("{name}.{}", e.name()), e);
        }
        self.messages.insert(name, m);
    }
}

/// The mismatches between a message's schema and its descriptor.
fn drift(descriptors: &Descriptors, message_type: MessageType, doc: &Value) -> Vec<String> {
    let mut check = Drift {
        descriptors,
        doc,
        problems: Vec::new(),
        visited: BTreeSet::new(),
    };
    let full_name = format!(".{}", message_type.amqp_type());
    check.message(doc, &full_name, message_type.file_stem());
    check.problems
}

struct Drift<'a> {
    descriptors: &'a Descriptors,
    doc: &'a Value,
    problems: Vec<String>,
    visited: BTreeSet<String>,
}

impl<'a> Drift<'a> {
    fn problem(&mut self, at: &str, what: String) {
        self.problems.push(format!("{at}: {what}"));
    }

    fn message(&mut self, node: &Value, full_name: &str, at: &str) {
        if !self.visited.insert(full_name.to_owned()) {
            return;
        }
        let Some(descriptor) = self.descriptors.messages.get(full_name) else {
            return self.problem(at, format!("no message {full_name} in the descriptors"));
        };
        let Some(properties) = node.get("properties").and_then(Value::as_object) else {
            return self.problem(at, format!("schema for {full_name} has no properties"));
        };
        if node.get("additionalProperties") != Some(&Value::Bool(false)) {
            self.problem(
                at,
                "additionalProperties must be false, as the decoder rejects unknown fields".into(),
            );
        }
        let fields: BTreeMap<String, &FieldDescriptorProto> =
            descriptor.field.iter().map(|f| (json_name(f), f)).collect();
        for name in properties.keys() {
            if !fields.contains_key(name) {
                self.problem(at, format!("property {name} is not a field of {full_name}"));
            }
        }
        for required in node
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let required = required.as_str().unwrap_or_default();
            if !properties.contains_key(required) {
                self.problem(at, format!("required {required} is not a property"));
            }
        }
        for (json, field) in fields {
            let field_name = format!("{}.{}", full_name.trim_start_matches('.'), field.name());
            match properties.get(&json) {
                None => self.problem(
                    at,
                    format!("field {field_name} (JSON {json}) is missing from the schema"),
                ),
                Some(property) => self.field(property, field, &format!("{at}.{json}")),
            }
        }
    }

    fn field(&mut self, property: &Value, field: &FieldDescriptorProto, at: &str) {
        let property = self.deref(property);
        if field.label() != Label::Repeated {
            return self.single(property, field, at);
        }
        let entry = self
            .descriptors
            .messages
            .get(field.type_name())
            .filter(|m| m.options.as_ref().is_some_and(|o| o.map_entry()));
        match entry {
            Some(entry) => {
                if types(property) != ["object"] {
                    return self.problem(at, "a map must be a JSON object".into());
                }
                let value_field = &entry.field[1];
                match property.get("additionalProperties") {
                    Some(values) if values.is_object() => {
                        self.single(self.deref(values), value_field, at)
                    }
                    _ => self.problem(
                        at,
                        "a map needs an additionalProperties schema for its values".into(),
                    ),
                }
            }
            None => {
                if types(property) != ["array"] {
                    return self.problem(at, "a repeated field must be a JSON array".into());
                }
                match property.get("items") {
                    Some(items) => self.single(self.deref(items), field, at),
                    None => self.problem(at, "an array needs an items schema".into()),
                }
            }
        }
    }

    fn single(&mut self, property: &Value, field: &FieldDescriptorProto, at: &str) {
        let property = self.deref(property);
        let t = types(property);
        let expect = |ok: bool, what: &str, problems: &mut Vec<String>| {
            if !ok {
                problems.push(format!("{at}: expected {what}, schema says {property}"));
            }
        };
        match field.r#type() {
            Type::String | Type::Bytes => {
                expect(t == ["string"], "type string", &mut self.problems)
            }
            Type::Bool => expect(t == ["boolean"], "type boolean", &mut self.problems),
            Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Fixed32 | Type::Sfixed32 => {
                expect(t == ["integer"], "type integer", &mut self.problems)
            }
            Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => expect(
                t.contains(&"string") && property.get("pattern").is_some(),
                "a string of digits (64-bit integers are strings in proto3 JSON)",
                &mut self.problems,
            ),
            Type::Double | Type::Float => {
                expect(t == ["number"], "type number", &mut self.problems)
            }
            Type::Enum => self.enumeration(property, field.type_name(), at),
            Type::Message => match field.type_name() {
                ".google.protobuf.Timestamp" => expect(
                    t == ["string"] && property.get("format") == Some(&Value::from("date-time")),
                    "an RFC 3339 date-time string",
                    &mut self.problems,
                ),
                ".google.protobuf.Duration" => expect(
                    t == ["string"]
                        && property
                            .get("pattern")
                            .and_then(Value::as_str)
                            .is_some_and(|p| p.ends_with("s$")),
                    "a duration string such as \"3600s\"",
                    &mut self.problems,
                ),
                name => self.message(property, name, at),
            },
            Type::Group => self.problem(at, "groups are not part of the contract".into()),
        }
    }

    fn enumeration(&mut self, property: &Value, enum_name: &str, at: &str) {
        let Some(descriptor) = self.descriptors.enums.get(enum_name) else {
            return self.problem(at, format!("no enum {enum_name} in the descriptors"));
        };
        let Some(listed) = property.get("enum").and_then(Value::as_array) else {
            return self.problem(at, format!("{enum_name} must list its names in `enum`"));
        };
        let listed: BTreeSet<&str> = listed.iter().filter_map(Value::as_str).collect();
        for value in &descriptor.value {
            // The zero value may be left out: proto3 JSON omits it, and validation may require another.
            if value.number() != 0 && !listed.contains(value.name()) {
                self.problem(
                    at,
                    format!("{enum_name} value {} is not in the schema", value.name()),
                );
            }
        }
        for name in listed {
            if !descriptor.value.iter().any(|v| v.name() == name) {
                self.problem(at, format!("{name} is not a value of {enum_name}"));
            }
        }
    }

    /// Follows a local `$ref` (`#/$defs/Name`).
    fn deref<'v>(&self, node: &'v Value) -> &'v Value
    where
        'a: 'v,
    {
        match node.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let pointer = reference.trim_start_matches('#');
                self.doc.pointer(pointer).unwrap_or(&Value::Null)
            }
            None => node,
        }
    }
}

/// The JSON types a schema node allows.
fn types(node: &Value) -> Vec<&str> {
    match node.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// The proto3 JSON name of a field: protoc's json_name, or lowerCamelCase of the field name.
fn json_name(field: &FieldDescriptorProto) -> String {
    if let Some(name) = field.json_name.as_deref().filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    let mut out = String::new();
    let mut upper = false;
    for c in field.name().chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------
// Invalid fixtures.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    file: String,
    base: String,
    stage: String,
    field: String,
    reason: String,
    message: Option<String>,
    schema: String,
}

fn fixtures_dir() -> std::path::PathBuf {
    root().join("tests/fixtures/invalid")
}

fn index() -> Index {
    let text = std::fs::read_to_string(fixtures_dir().join("index.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

/// Each invalid message is rejected at the expected stage (decoding or validation), with an error that
/// names the expected field first (`<field>: ...`), carries the expected reason code and text, and the
/// JSON Schema agrees where a schema can express the rule.
#[test]
fn invalid_fixtures_are_rejected_naming_the_field() {
    let config = test_config();
    let mut problems = Vec::new();
    for case in index().case {
        let path = fixtures_dir().join(&case.file);
        let message_type = MessageType::from_file_name(Path::new(&case.file)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let (stage, field, reason, text) =
            match messages::decode_any(message_type, Format::Json, &bytes) {
                Err(e) => (
                    "decode",
                    e.field().unwrap_or_default().to_owned(),
                    e.reason(),
                    e.to_string(),
                ),
                Ok(message) => match validate::message(&message, &config) {
                    Err(e) => ("validate", e.field().to_owned(), e.reason(), e.to_string()),
                    Ok(()) => {
                        problems.push(format!("{}: accepted", case.file));
                        continue;
                    }
                },
            };
        let mut wrong = |what: &str, got: &str, expected: &str| {
            if got != expected {
                problems.push(format!(
                    "{}: {what} is {got:?}, expected {expected:?} ({text})",
                    case.file
                ));
            }
        };
        wrong("stage", stage, &case.stage);
        wrong("field", &field, &case.field);
        wrong("reason", reason, &case.reason);
        if !text.starts_with(&format!("{}: ", case.field)) {
            problems.push(format!(
                "{}: the error does not start with the field: {text}",
                case.file
            ));
        }
        if let Some(part) = &case.message
            && !text.contains(part.as_str())
        {
            problems.push(format!("{}: {text:?} does not contain {part:?}", case.file));
        }
        let schema_valid = validator(message_type).is_valid(&read_json(&path));
        let expected_valid = match case.schema.as_str() {
            "accepts" => true,
            "rejects" => false,
            other => panic!(
                "{}: schema must be accepts or rejects, not {other}",
                case.file
            ),
        };
        if schema_valid != expected_valid {
            problems.push(format!(
                "{}: the schema {} it",
                case.file,
                if schema_valid { "accepts" } else { "rejects" }
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each fixture differs from its base example in exactly one place, so it tests one rule; every file in
/// the directory has a case and every case a file.
#[test]
fn fixtures_are_examples_broken_in_one_way() {
    let cases = index().case;
    let listed: BTreeSet<String> = cases.iter().map(|c| c.file.clone()).collect();
    let present: BTreeSet<String> = support::json_files(&fixtures_dir())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, present, "index.toml and the fixture files differ");
    assert!(cases.len() >= 20, "only {} invalid fixtures", cases.len());
    for case in cases {
        let fixture = read_json(&fixtures_dir().join(&case.file));
        let base = read_json(&root().join("schemas/examples").join(&case.base));
        let n = differences(&base, &fixture);
        assert_eq!(
            n, 1,
            "{} differs from {} in {n} places",
            case.file, case.base
        );
    }
}

/// The number of places where two JSON values differ: a changed scalar, an added or removed member, an
/// added or removed array element, or an object replaced by one with other members (another member of
/// a oneof) counts one each.
fn differences(a: &Value, b: &Value) -> usize {
    match (a, b) {
        (Value::Object(x), Value::Object(y))
            if !x.is_empty() && !y.is_empty() && !x.keys().any(|k| y.contains_key(k)) =>
        {
            1
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter()
                .map(|k| match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(u, v),
                    _ => 1,
                })
                .sum()
        }
        (Value::Array(x), Value::Array(y)) => {
            let common: usize = x.iter().zip(y).map(|(u, v)| differences(u, v)).sum();
            common + x.len().abs_diff(y.len())
        }
        _ => usize::from(a != b),
    }
}

/// Protobuf input is validated the same way: an example re-encoded as protobuf with one field broken
/// is rejected naming the field, including an enum number the contract does not define (which JSON
/// cannot even express).
#[test]
fn protobuf_messages_are_validated_too() {
    let config = test_config();
    let bytes = std::fs::read(root().join("schemas/examples/submit-job.figlet.json")).unwrap();
    let job: v1::SubmitJob = messages::decode(Format::Json, &bytes).unwrap();

    let mut broken = job.clone();
    broken.application.as_mut().unwrap().application_type = 42;
    let decoded: v1::SubmitJob = messages::decode(
        Format::Protobuf,
        &messages::encode(Format::Protobuf, &broken).unwrap(),
    )
    .unwrap();
    let e = validate::submit(&decoded, &config).unwrap_err();
    assert_eq!(
        e.to_string(),
        "application.applicationType: unknown application type 42"
    );

    let mut broken = job;
    broken.product.as_mut().unwrap().cpu = 0;
    let decoded: v1::SubmitJob = messages::decode(
        Format::Protobuf,
        &messages::encode(Format::Protobuf, &broken).unwrap(),
    )
    .unwrap();
    assert_eq!(
        validate::submit(&decoded, &config).unwrap_err().field(),
        "product.cpu"
    );
}

/// A message that is not an inbound message is refused on the jobs queue, and decode_inbound accepts
/// each inbound example in both formats.
#[test]
fn inbound_examples_decode_from_amqp_properties() {
    for (path, message_type) in examples() {
        let json = std::fs::read(&path).unwrap();
        let message = messages::decode_any(message_type, Format::Json, &json).unwrap();
        for format in Format::ALL {
            let body = message.encode(format).unwrap();
            let result = messages::decode_inbound(
                Some(message_type.amqp_type()),
                Some(format.content_type()),
                &body,
            );
            match (message_type.is_inbound(), result) {
                (true, Ok(inbound)) => {
                    let again = match inbound {
                        messages::Inbound::Submit(m) => AnyMessage::SubmitJob(m),
                        messages::Inbound::Cancel(m) => AnyMessage::CancelJob(m),
                        messages::Inbound::Extend(m) => AnyMessage::ExtendJob(m),
                    };
                    assert_eq!(again, message, "{}", path.display());
                }
                (false, Err(messages::DecodeError::NotInbound(t))) => assert_eq!(t, message_type),
                (_, other) => panic!("{} as {format}: {other:?}", path.display()),
            }
        }
    }
}

/// Every pattern in the schemas that describes a whole value is anchored at both ends: a JSON Schema
/// pattern matches anywhere in the string, so `^/.*[^/].*` without its `$` would let a line break and
/// anything after it through. The one unanchored pattern, `\S`, says "not blank" on purpose.
#[test]
fn schema_patterns_are_anchored_at_both_ends() {
    fn patterns<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
        match v {
            Value::Object(map) => {
                for (key, value) in map {
                    if key == "pattern"
                        && let Some(p) = value.as_str()
                    {
                        out.push((at.clone(), p));
                    } else {
                        patterns(value, format!("{at}/{key}"), out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    patterns(item, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    let mut schemas = Vec::new();
    for entry in std::fs::read_dir(root().join("schemas")).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".schema.json") {
            schemas.push((path.clone(), read_json(&path)));
        }
    }
    for (path, schema) in &schemas {
        patterns(schema, path.display().to_string(), &mut found);
    }
    assert!(
        found.iter().any(|(at, _)| at.contains("StoragePath")),
        "the walk reaches the StoragePath definition: {found:?}"
    );
    let unanchored: Vec<_> = found
        .iter()
        .filter(|(_, p)| *p != r"\S" && !(p.starts_with('^') && p.ends_with('$')))
        .collect();
    assert!(unanchored.is_empty(), "{unanchored:#?}");
}
