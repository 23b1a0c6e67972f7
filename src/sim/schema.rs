//! Structural schemas of CustomResourceDefinitions (`openAPIV3Schema`): pruning of unknown fields,
//! defaulting, and validation with the messages the API server gives.
//!
//! The order follows the API server: unknown fields are pruned, `null` in non-nullable fields is
//! dropped, defaults are filled in, then the object is validated. Only the keywords that occur in
//! structural schemas are understood; `anyOf` appears only beside `x-kubernetes-int-or-string`.

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde_json::{Map, Value};

use super::error::{FieldError, FieldErrorKind, format_value};

/// One node of a structural schema.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    pub ty: Option<String>,
    pub format: Option<String>,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties` as a schema: the values of a map.
    pub additional: Option<Box<Schema>>,
    /// `additionalProperties: true`.
    pub additional_any: bool,
    pub items: Option<Box<Schema>>,
    pub required: Vec<String>,
    /// The `enum` keyword.
    pub enumeration: Vec<Value>,
    pub nullable: bool,
    pub preserve_unknown: bool,
    pub int_or_string: bool,
    pub embedded: bool,
    pub default: Option<Value>,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub min_length: Option<usize>,
    pub max_length: Option<usize>,
    pub min_items: Option<usize>,
    pub max_items: Option<usize>,
    pub pattern: Option<(String, Regex)>,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
}

impl Schema {
    /// Reads a schema node from its JSON form (converted from the CRD's YAML).
    pub fn from_json(v: &Value) -> Schema {
        let mut s = Schema::default();
        let Some(m) = v.as_object() else { return s };
        let str_of = |k: &str| m.get(k).and_then(Value::as_str).map(String::from);
        let bool_of = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(false);
        let usize_of = |k: &str| m.get(k).and_then(Value::as_u64).map(|n| n as usize);
        s.ty = str_of("type");
        s.format = str_of("format");
        if let Some(Value::Object(props)) = m.get("properties") {
            s.properties = props
                .iter()
                .map(|(k, v)| (k.clone(), Schema::from_json(v)))
                .collect();
        }
        match m.get("additionalProperties") {
            Some(Value::Bool(b)) => s.additional_any = *b,
            Some(v @ Value::Object(_)) => s.additional = Some(Box::new(Schema::from_json(v))),
            _ => {}
        }
        if let Some(items) = m.get("items") {
            s.items = Some(Box::new(Schema::from_json(items)));
        }
        if let Some(Value::Array(req)) = m.get("required") {
            s.required = req
                .iter()
                .filter_map(|r| r.as_str().map(String::from))
                .collect();
        }
        if let Some(Value::Array(e)) = m.get("enum") {
            s.enumeration = e.clone();
        }
        s.nullable = bool_of("nullable");
        s.preserve_unknown = bool_of("x-kubernetes-preserve-unknown-fields");
        s.int_or_string = bool_of("x-kubernetes-int-or-string");
        s.embedded = bool_of("x-kubernetes-embedded-resource");
        s.default = m.get("default").cloned();
        s.minimum = m.get("minimum").and_then(Value::as_f64);
        s.maximum = m.get("maximum").and_then(Value::as_f64);
        s.exclusive_minimum = bool_of("exclusiveMinimum");
        s.exclusive_maximum = bool_of("exclusiveMaximum");
        s.min_length = usize_of("minLength");
        s.max_length = usize_of("maxLength");
        s.min_items = usize_of("minItems");
        s.max_items = usize_of("maxItems");
        if let Some(p) = str_of("pattern")
            && let Ok(re) = Regex::new(&p)
        {
            s.pattern = Some((p, re));
        }
        s.list_type = str_of("x-kubernetes-list-type");
        if let Some(Value::Array(keys)) = m.get("x-kubernetes-list-map-keys") {
            s.list_map_keys = keys
                .iter()
                .filter_map(|k| k.as_str().map(String::from))
                .collect();
        }
        s
    }

    /// Follows a dotted path of property names (for tests and the model).
    pub fn at(&self, path: &str) -> Option<&Schema> {
        let mut cur = self;
        for seg in path.split('.').filter(|s| !s.is_empty()) {
            cur = if seg == "[]" {
                cur.items.as_deref()?
            } else {
                cur.properties.get(seg).or(cur.additional.as_deref())?
            };
        }
        Some(cur)
    }
}

/// What pruning, defaulting and validation found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub errors: Vec<FieldError>,
    /// Paths of the fields that were pruned as unknown (for `fieldValidation=Strict` and warnings).
    pub unknown: Vec<String>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => matches!(v, Value::Number(n) if n.is_i64() || n.is_u64()),
        "number" => v.is_number(),
        _ => true,
    }
}

/// Where a value is in the object (`spec.tasks[0].name`), written out only for an error: the walk
/// visits every field of every write, and building each path as a string was most of its cost.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

impl From<&Path<'_>> for String {
    fn from(path: &Path<'_>) -> String {
        path.to_string()
    }
}

/// Prunes, defaults and validates `value` (the whole object) against the root schema.
pub fn apply(schema: &Schema, value: &mut Value) -> Outcome {
    let mut out = Outcome::default();
    walk(schema, value, &Path::Root, Level::Root(None), &mut out);
    out
}

/// [`apply`] for an update of `old`, an object stored through this schema (so already pruned,
/// defaulted and valid): a top-level field the update left exactly as it was is not walked again.
/// Most updates touch one part of an object (an annotation patch leaves `spec` and `status` alone, a
/// status update leaves `spec`), and walking a VolcanoJob's whole pod template against the CRD's
/// schema at every patch was a tenth of the simulator's CPU in `volcano-runner bench`. The outcome is
/// the same: walking an unchanged, already admitted field prunes, defaults and reports nothing (as
/// with Kubernetes' validation ratcheting, an unchanged field is not held against an update).
pub fn apply_update(schema: &Schema, value: &mut Value, old: &Value) -> Outcome {
    let mut out = Outcome::default();
    walk(
        schema,
        value,
        &Path::Root,
        Level::Root(old.as_object()),
        &mut out,
    );
    out
}

/// Where [`walk`] is: at the object's root (with, for an update, the object it replaces), or below.
#[derive(Clone, Copy)]
enum Level<'a> {
    Root(Option<&'a Map<String, Value>>),
    Nested,
}

fn walk(schema: &Schema, value: &mut Value, path: &Path<'_>, level: Level<'_>, out: &mut Outcome) {
    if value.is_null() {
        if !schema.nullable {
            let expected = schema.ty.as_deref().unwrap_or("object");
            out.errors.push(FieldError::invalid(
                path,
                &Value::String("null".into()),
                format!("{path} in body must be of type {expected}: \"null\""),
            ));
        }
        return;
    }
    if schema.int_or_string {
        if !matches!(type_name(value), "integer" | "string") {
            let actual = type_name(value);
            out.errors.push(FieldError::invalid(
                path,
                &Value::String(actual.into()),
                format!("{path} in body must be of type integer,string: \"{actual}\""),
            ));
            return;
        }
    } else if let Some(ty) = &schema.ty
        && !type_matches(ty, value)
    {
        let actual = type_name(value);
        out.errors.push(FieldError::invalid(
            path,
            &Value::String(actual.into()),
            format!("{path} in body must be of type {ty}: \"{actual}\""),
        ));
        return;
    }
    if !schema.enumeration.is_empty() && !schema.enumeration.contains(value) {
        out.errors.push(FieldError {
            field: path.to_string(),
            kind: FieldErrorKind::NotSupported {
                value: format_value(value),
                supported: schema
                    .enumeration
                    .iter()
                    .map(|e| {
                        e.as_str()
                            .map(String::from)
                            .unwrap_or_else(|| e.to_string())
                    })
                    .collect(),
            },
        });
    }
    match value {
        Value::String(s) => check_string(schema, s, path, out),
        Value::Number(n) => {
            let as_f64 = n.as_f64().unwrap_or(0.0);
            check_number(schema, as_f64, value, path, out)
        }
        Value::Array(items) => {
            if let Some(min) = schema.min_items
                && items.len() < min
            {
                out.errors.push(FieldError::invalid(
                    path,
                    &Value::from(items.len()),
                    format!("{path} in body should have at least {min} items"),
                ));
            }
            if let Some(max) = schema.max_items
                && items.len() > max
            {
                out.errors.push(FieldError {
                    field: path.to_string(),
                    kind: FieldErrorKind::Invalid {
                        value: items.len().to_string(),
                        detail: format!("must have at most {max} items"),
                    },
                });
            }
            if let Some(item_schema) = &schema.items {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &Path::Index(path, i), Level::Nested, out);
                }
            }
            check_list_uniqueness(schema, items, path, out);
        }
        Value::Object(map) => walk_object(schema, map, path, level, out),
        _ => {}
    }
}

fn check_string(schema: &Schema, s: &str, path: &Path<'_>, out: &mut Outcome) {
    let v = || Value::String(s.to_string());
    if let Some(max) = schema.max_length
        && s.chars().count() > max
    {
        out.errors.push(FieldError {
            field: path.to_string(),
            kind: FieldErrorKind::TooLong { max },
        });
    }
    if let Some(min) = schema.min_length
        && s.chars().count() < min
    {
        out.errors.push(FieldError::invalid(
            path,
            &v(),
            format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some((src, re)) = &schema.pattern
        && !re.is_match(s)
    {
        out.errors.push(FieldError::invalid(
            path,
            &v(),
            format!("{path} in body should match '{src}'"),
        ));
    }
    if schema.format.as_deref() == Some("date-time") && s.parse::<jiff::Timestamp>().is_err() {
        out.errors.push(FieldError::invalid(
            path,
            &v(),
            format!("{path} in body must be of type date-time: {s:?}"),
        ));
    }
}

fn check_number(schema: &Schema, n: f64, v: &Value, path: &Path<'_>, out: &mut Outcome) {
    if let Some(min) = schema.minimum {
        let bad = if schema.exclusive_minimum {
            n <= min
        } else {
            n < min
        };
        if bad {
            let op = if schema.exclusive_minimum {
                "greater than"
            } else {
                "greater than or equal to"
            };
            out.errors.push(FieldError::invalid(
                path,
                v,
                format!("{path} in body should be {op} {min}"),
            ));
        }
    }
    if let Some(max) = schema.maximum {
        let bad = if schema.exclusive_maximum {
            n >= max
        } else {
            n > max
        };
        if bad {
            let op = if schema.exclusive_maximum {
                "less than"
            } else {
                "less than or equal to"
            };
            out.errors.push(FieldError::invalid(
                path,
                v,
                format!("{path} in body should be {op} {max}"),
            ));
        }
    }
    if schema.ty.as_deref() == Some("integer") && schema.format.as_deref() == Some("int32") {
        let fits = v.as_i64().is_some_and(|i| i32::try_from(i).is_ok());
        if !fits {
            out.errors.push(FieldError::invalid(
                path,
                v,
                format!("{path} in body must be of type int32: {v}"),
            ));
        }
    }
}

fn check_list_uniqueness(schema: &Schema, items: &[Value], path: &Path<'_>, out: &mut Outcome) {
    match schema.list_type.as_deref() {
        Some("set") => {
            let mut seen = BTreeSet::new();
            for (i, item) in items.iter().enumerate() {
                if !seen.insert(item.to_string()) {
                    out.errors.push(FieldError {
                        field: format!("{path}[{i}]"),
                        kind: FieldErrorKind::Duplicate {
                            value: format_value(item),
                        },
                    });
                }
            }
        }
        Some("map") if !schema.list_map_keys.is_empty() => {
            let mut seen = BTreeSet::new();
            for (i, item) in items.iter().enumerate() {
                let key: Vec<String> = schema
                    .list_map_keys
                    .iter()
                    .map(|k| item.get(k).map(Value::to_string).unwrap_or_default())
                    .collect();
                if !seen.insert(key.clone()) {
                    let shown: Vec<String> = schema
                        .list_map_keys
                        .iter()
                        .zip(&key)
                        .map(|(k, v)| format!("{k:?}:{v}"))
                        .collect();
                    out.errors.push(FieldError {
                        field: format!("{path}[{i}]"),
                        kind: FieldErrorKind::Duplicate {
                            value: format!("map[string]interface {{}}{{{}}}", shown.join(", ")),
                        },
                    });
                }
            }
        }
        _ => {}
    }
}

fn walk_object(
    schema: &Schema,
    map: &mut Map<String, Value>,
    path: &Path<'_>,
    level: Level<'_>,
    out: &mut Outcome,
) {
    let (root, old) = match level {
        Level::Root(old) => (true, old),
        Level::Nested => (false, None),
    };
    let keeps_meta = root || schema.embedded;
    // 1. prune unknown fields and nulls of non-nullable fields.
    map.retain(|key, value| {
        if keeps_meta && (key == "apiVersion" || key == "kind" || key == "metadata") {
            return true;
        }
        match schema.properties.get(key).or(schema.additional.as_deref()) {
            Some(child) => child.nullable || !value.is_null(),
            None if schema.preserve_unknown || schema.additional_any => true,
            None => {
                out.unknown.push(Path::Key(path, key).to_string());
                false
            }
        }
    });
    // 2. defaults.
    for (key, child) in &schema.properties {
        if !map.contains_key(key)
            && let Some(d) = &child.default
        {
            map.insert(key.clone(), d.clone());
        }
    }
    // 3. required.
    for req in &schema.required {
        if !map.contains_key(req) {
            out.errors
                .push(FieldError::required(Path::Key(path, req).to_string(), ""));
        }
    }
    // 4. children.
    for (key, child_value) in map.iter_mut() {
        // The object's own apiVersion, kind and metadata are checked as ObjectMeta, not by the schema.
        if keeps_meta && (key == "apiVersion" || key == "kind" || key == "metadata") {
            continue;
        }
        if old.is_some_and(|old| old.get(key) == Some(&*child_value)) {
            continue;
        }
        let child = schema.properties.get(key).or(schema.additional.as_deref());
        if let Some(child) = child {
            walk(
                child,
                child_value,
                &Path::Key(path, key),
                Level::Nested,
                out,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::from_json(&json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["tasks"],
                    "properties": {
                        "maxRetry": {"type": "integer", "format": "int32", "minimum": 0, "default": 3},
                        "queue": {"type": "string", "default": "default"},
                        "plugins": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                        "tasks": {"type": "array", "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                                "replicas": {"type": "integer", "format": "int32", "minimum": 0},
                                "mode": {"type": "string", "enum": ["a", "b"]},
                                "cpu": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "when": {"type": "string", "format": "date-time"}
                            }
                        }}
                    }
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        }))
    }

    #[test]
    fn wrong_type_has_the_api_server_message() {
        let mut obj = json!({"spec": {"tasks": [{"name": "job", "replicas": "string"}]}});
        let out = apply(&schema(), &mut obj);
        assert_eq!(out.errors.len(), 1);
        assert_eq!(
            out.errors[0].to_string(),
            "spec.tasks[0].replicas: Invalid value: \"string\": spec.tasks[0].replicas in body must be of type integer: \"string\""
        );
    }

    /// An update walks only the top-level fields it changed: an annotation patch of an admitted
    /// object is not checked field by field again (the stored `spec` here holds what the schema would
    /// refuse now, as after a CRD change: it is let be, as validation ratcheting lets an unchanged field
    /// be), while a `spec` the update changes is checked, defaulted and pruned as on a create.
    #[test]
    fn an_update_walks_only_the_top_level_fields_it_changed() {
        let old = json!({
            "metadata": {"name": "x"},
            "spec": {"tasks": [{"name": "job", "replicas": "string"}], "maxRetry": 3, "queue": "default"},
            "status": {"phase": "Running"}
        });
        let mut annotated = old.clone();
        annotated["metadata"]["annotations"] = json!({"a": "b"});
        let out = apply_update(&schema(), &mut annotated, &old);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(annotated["spec"], old["spec"]);
        assert_eq!(
            apply(&schema(), &mut old.clone()).errors.len(),
            1,
            "the whole object, walked, holds the refused value"
        );

        let mut respecified = old.clone();
        respecified["spec"] = json!({"tasks": [{"name": "job", "replicas": "two", "bogus": 1}]});
        let out = apply_update(&schema(), &mut respecified, &old);
        assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
        assert_eq!(out.unknown, vec!["spec.tasks[0].bogus".to_string()]);
        assert_eq!(respecified["spec"]["maxRetry"], 3, "defaulted");
    }

    #[test]
    fn prunes_unknown_fields_and_applies_defaults() {
        let mut obj = json!({
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "x"},
            "spec": {"tasks": [{"name": "job", "bogus": 1, "free": {"anything": {"goes": true}}}], "extra": "x"},
            "junk": 1
        });
        let out = apply(&schema(), &mut obj);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            out.unknown,
            vec![
                "junk".to_string(),
                "spec.extra".to_string(),
                "spec.tasks[0].bogus".to_string()
            ]
        );
        assert_eq!(obj["spec"]["maxRetry"], 3);
        assert_eq!(obj["spec"]["queue"], "default");
        assert_eq!(obj["spec"]["tasks"][0]["free"]["anything"]["goes"], true);
        assert_eq!(obj["metadata"]["name"], "x");
    }

    #[test]
    fn null_in_non_nullable_field_is_dropped_then_defaulted() {
        let mut obj = json!({"spec": {"tasks": [], "maxRetry": null}});
        let out = apply(&schema(), &mut obj);
        assert!(out.errors.is_empty());
        assert_eq!(obj["spec"]["maxRetry"], 3);
    }

    #[test]
    fn required_enum_pattern_minimum_int_or_string_format() {
        let mut obj = json!({"spec": {}});
        let out = apply(&schema(), &mut obj);
        assert_eq!(out.errors[0].to_string(), "spec.tasks: Required value");

        let mut obj = json!({"spec": {"tasks": [{"name": "Bad_Name", "replicas": -1, "mode": "c", "cpu": true, "when": "yesterday"}]}});
        let out = apply(&schema(), &mut obj);
        let msgs: Vec<String> = out.errors.iter().map(ToString::to_string).collect();
        assert!(
            msgs.contains(
                &"spec.tasks[0].mode: Unsupported value: \"c\": supported values: \"a\", \"b\""
                    .to_string()
            ),
            "{msgs:?}"
        );
        assert!(msgs.iter().any(|m| m.starts_with("spec.tasks[0].name: Invalid value: \"Bad_Name\": spec.tasks[0].name in body should match")), "{msgs:?}");
        assert!(msgs.contains(&"spec.tasks[0].replicas: Invalid value: -1: spec.tasks[0].replicas in body should be greater than or equal to 0".to_string()), "{msgs:?}");
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("spec.tasks[0].cpu: Invalid value: \"boolean\"")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter().any(|m| m.contains("must be of type date-time")),
            "{msgs:?}"
        );
        assert_eq!(msgs.len(), 5, "{msgs:?}");

        let mut ok = json!({"spec": {"tasks": [{"cpu": "500m"}, {"cpu": 2}], "plugins": {"svc": [], "env": ["--x"]}}});
        assert!(apply(&schema(), &mut ok).errors.is_empty());
        let mut bad_map = json!({"spec": {"tasks": [], "plugins": {"svc": [1]}}});
        let out = apply(&schema(), &mut bad_map);
        assert_eq!(out.errors[0].field, "spec.plugins.svc[0]");
    }

    #[test]
    fn int32_overflow_is_refused() {
        let mut obj = json!({"spec": {"tasks": [{"replicas": 3_000_000_000u64}]}});
        let out = apply(&schema(), &mut obj);
        assert_eq!(out.errors.len(), 1);
    }
}
