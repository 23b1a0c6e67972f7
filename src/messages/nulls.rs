//! `null` for a field, as the proto3 JSON mapping says: "accepted for all field types and treated as the
//! default value of the corresponding field type". pbjson accepts it for `optional` fields and message
//! fields only, and refuses it for plain scalars, enums, repeated fields and maps (`"gpu": null`,
//! `"resources": null`). So before a document that has such a `null` is decoded again, every member of a
//! message object that names a field of that message and holds `null` is removed: the field is then at
//! its default, exactly as if it had been left out.
//!
//! Which keys are fields comes from the contract's compiled descriptors ([`super::FILE_DESCRIPTOR_SET`]),
//! so a misspelt field is still refused as unknown, `null` or not. A `null` inside a list or as a map
//! value is not a field and stays an error.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use serde_json::Value;

/// One field of a message, as JSON names it.
struct Field {
    /// The lowerCamelCase name.
    json_name: String,
    /// The proto name, which the decoder accepts too.
    name: String,
    /// What a non-null value holds: nothing to look into, a message, or a list or map of messages.
    shape: Shape,
}

enum Shape {
    Leaf,
    Message(String),
    List(String),
    Map(String),
}

/// Every message of the contract by its full name (`.volcano_runner.v1.SubmitJob`).
struct Contract {
    messages: HashMap<String, Vec<Field>>,
}

impl Contract {
    fn get() -> &'static Contract {
        static CONTRACT: OnceLock<Contract> = OnceLock::new();
        CONTRACT.get_or_init(|| {
            // The descriptors are compiled into the binary by build.rs; they always decode.
            let set = FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).unwrap_or_default();
            let mut all: HashMap<String, &DescriptorProto> = HashMap::new();
            fn collect<'a>(
                prefix: &str,
                message: &'a DescriptorProto,
                all: &mut HashMap<String, &'a DescriptorProto>,
            ) {
                let name = format!("{prefix}.{}", message.name());
                for nested in &message.nested_type {
                    collect(&name, nested, all);
                }
                all.insert(name, message);
            }
            for file in &set.file {
                let prefix = match file.package() {
                    "" => String::new(),
                    package => format!(".{package}"),
                };
                for message in &file.message_type {
                    collect(&prefix, message, &mut all);
                }
            }
            let is_map_entry = |name: &str| {
                all.get(name)
                    .is_some_and(|m| m.options.as_ref().is_some_and(|o| o.map_entry()))
            };
            // A message the mapping writes as an object of fields (the well-known types are strings).
            let is_object =
                |name: &str| all.contains_key(name) && !name.starts_with(".google.protobuf.");
            let messages = all
                .iter()
                .map(|(name, message)| {
                    let fields = message
                        .field
                        .iter()
                        .map(|f| {
                            let target = f.type_name();
                            let shape = if f.r#type() != Type::Message {
                                Shape::Leaf
                            } else if is_map_entry(target) {
                                let value = all
                                    .get(target)
                                    .and_then(|e| e.field.iter().find(|v| v.number() == 2))
                                    .filter(|v| v.r#type() == Type::Message)
                                    .map(|v| v.type_name().to_owned())
                                    .filter(|v| is_object(v));
                                value.map_or(Shape::Leaf, Shape::Map)
                            } else if !is_object(target) {
                                Shape::Leaf
                            } else if f.label() == Label::Repeated {
                                Shape::List(target.to_owned())
                            } else {
                                Shape::Message(target.to_owned())
                            };
                            Field {
                                json_name: f.json_name().to_owned(),
                                name: f.name().to_owned(),
                                shape,
                            }
                        })
                        .collect();
                    (name.clone(), fields)
                })
                .collect();
            Contract { messages }
        })
    }
}

/// Removes every member of a message object in `document` (a `message` at the top, e.g.
/// `.volcano_runner.v1.SubmitJob`) that names a field and holds `null`; says whether it removed any.
pub(super) fn strip(document: &mut Value, message: &str) -> bool {
    strip_in(Contract::get(), document, message)
}

fn strip_in(contract: &Contract, value: &mut Value, message: &str) -> bool {
    let (Some(fields), Value::Object(members)) = (contract.messages.get(message), value) else {
        return false;
    };
    let field = |key: &str| fields.iter().find(|f| f.json_name == key || f.name == key);
    let before = members.len();
    members.retain(|key, v| !(v.is_null() && field(key).is_some()));
    let mut stripped = members.len() != before;
    for (key, v) in members.iter_mut() {
        match field(key).map(|f| &f.shape) {
            Some(Shape::Message(m)) => stripped |= strip_in(contract, v, m),
            Some(Shape::List(m)) => {
                for item in v.as_array_mut().into_iter().flatten() {
                    stripped |= strip_in(contract, item, m);
                }
            }
            Some(Shape::Map(m)) => {
                for item in v.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                    stripped |= strip_in(contract, item, m);
                }
            }
            Some(Shape::Leaf) | None => {}
        }
    }
    stripped
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Nulls of fields go at every depth (messages, lists and maps of messages); unknown keys, list
    /// elements and map values stay, so the decoder still refuses them.
    #[test]
    fn only_fields_that_hold_null_go() {
        let mut doc = json!({
            "jobId": "1",
            "gpu": null,
            "exclusiveNodes": null,
            "job_name": null,
            "bogus": null,
            "product": {"id": "p", "gpu": null},
            "resources": [{"peer": {"hostname": "db", "jobId": null}}],
            "parameters": {"a": {"integer": null}, "b": null},
            "submittedAt": "2026-01-01T00:00:00Z",
        });
        assert!(strip(&mut doc, ".volcano_runner.v1.SubmitJob"));
        assert_eq!(
            doc,
            json!({
                "jobId": "1",
                "gpu": null,
                "bogus": null,
                "product": {"id": "p"},
                "resources": [{"peer": {"hostname": "db"}}],
                "parameters": {"a": {}, "b": null},
                "submittedAt": "2026-01-01T00:00:00Z",
            }),
            "SubmitJob has no gpu field of its own; map values are not fields"
        );
        let mut clean = json!({"jobId": "1", "reason": "r"});
        assert!(!strip(&mut clean, ".volcano_runner.v1.CancelJob"));
    }
}
