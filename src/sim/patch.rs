//! The four patch kinds of the API: JSON merge patch (RFC 7386), JSON patch (RFC 6902, with `test`),
//! strategic merge patch for built-in kinds, and server-side apply (merged like the other two).

use serde_json::{Map, Value};

/// Which patch the `Content-Type` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    /// Reads the kind from a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The body is not a patch of its kind (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well-formed but fails on this object, e.g. a `test` op (422).
    #[error("{0}")]
    Failed(String),
}

/// Applies an RFC 7386 merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Applies an RFC 6902 JSON patch given as its JSON body.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::Malformed(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| PatchError::Failed(e.to_string()))
}

/// The merge key of a list field in built-in kinds, chosen by field name (and, for `ports`, by content).
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ownerReferences" => Some("uid"),
        "conditions" => Some("type"),
        "hostAliases" => Some("ip"),
        "ports" => {
            if sample.and_then(|s| s.get("containerPort")).is_some() {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        _ => None,
    }
}

/// Lists of scalars that strategic merge unions instead of replacing.
fn is_merged_primitive_list(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch, with the `$patch`, `$retainKeys`, `$deleteFromPrimitiveList` and
/// `$setElementOrder` directives.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match patch_map.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch_map.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) => {
            return Err(PatchError::Malformed(format!(
                "unknown patch type: {other:?}"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target_map = target.as_object_mut().expect("made an object above");
    let mut retain: Option<Vec<String>> = None;
    for (key, value) in patch_map {
        if key == "$retainKeys" {
            retain = value.as_array().map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            });
            continue;
        }
        if key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) =
                (target_map.get_mut(field), value.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if value.is_null() {
            target_map.remove(key);
            continue;
        }
        match (target_map.get_mut(key), value) {
            (Some(existing @ Value::Object(_)), Value::Object(_)) => {
                strategic_merge(existing, value)?
            }
            (Some(Value::Array(existing)), Value::Array(items)) => {
                if let Some(mk) = merge_key(key, items.first().or(existing.first())) {
                    merge_list(existing, items, mk)?;
                } else if is_merged_primitive_list(key) {
                    for item in items {
                        if !existing.contains(item) {
                            existing.push(item.clone());
                        }
                    }
                } else {
                    *existing = strip_directives(items);
                }
            }
            _ => {
                target_map.insert(key.clone(), strip_directives_value(value));
            }
        }
    }
    if let Some(keys) = retain {
        target_map.retain(|k, _| keys.contains(k));
    }
    Ok(())
}

fn strip_directives(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|i| i.get("$patch").is_none())
        .map(strip_directives_value)
        .collect()
}

fn strip_directives_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives_value(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives_value).collect()),
        other => other.clone(),
    }
}

fn merge_list(existing: &mut Vec<Value>, items: &[Value], key: &str) -> Result<(), PatchError> {
    for item in items {
        let Some(k) = item.get(key) else {
            if item.get("$patch").and_then(Value::as_str) == Some("replace") {
                existing.clear();
                continue;
            }
            return Err(PatchError::Malformed(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let pos = existing.iter().position(|e| e.get(key) == Some(k));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                existing.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut existing[i], item)?,
            (None, false) => existing.push(strip_directives_value(item)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut t =
            json!({"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        merge(
            &mut t,
            &json!({"metadata": {"annotations": {"a": null, "c": "3"}}, "spec": {"x": [3]}}),
        );
        assert_eq!(
            t,
            json!({"metadata": {"annotations": {"b": "2", "c": "3"}}, "spec": {"x": [3]}})
        );
    }

    #[test]
    fn json_patch_test_op_guards_the_change() {
        let mut t = json!({"metadata": {"annotations": {"ucloud.dk/jobStart": "1"}}});
        let ok = json!([
            {"op": "test", "path": "/metadata/annotations/ucloud.dk~1jobStart", "value": "1"},
            {"op": "add", "path": "/metadata/annotations/ucloud.dk~1expiry", "value": "9"}
        ]);
        json_patch(&mut t, &ok).unwrap();
        assert_eq!(t["metadata"]["annotations"]["ucloud.dk/expiry"], "9");
        let bad = json!([
            {"op": "test", "path": "/metadata/annotations/ucloud.dk~1jobStart", "value": "2"},
            {"op": "remove", "path": "/metadata/annotations"}
        ]);
        let before = t.clone();
        assert!(matches!(
            json_patch(&mut t, &bad),
            Err(PatchError::Failed(_))
        ));
        assert_eq!(t, before, "a failed test leaves the object unchanged");
        assert!(matches!(
            json_patch(&mut t, &json!({"op": "add"})),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn strategic_merge_merges_containers_by_name_and_env_by_name() {
        let mut t = json!({"spec": {"containers": [
            {"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]},
            {"name": "b", "image": "y"}
        ], "tolerations": [{"key": "t"}]}});
        let p = json!({"spec": {"containers": [
            {"name": "a", "env": [{"name": "L", "value": "2"}]},
            {"name": "c", "image": "z"},
            {"name": "b", "$patch": "delete"}
        ], "tolerations": [{"key": "u"}]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(
            t,
            json!({"spec": {"containers": [
                {"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}, {"name": "L", "value": "2"}]},
                {"name": "c", "image": "z"}
            ], "tolerations": [{"key": "u"}]}})
        );
    }

    #[test]
    fn strategic_merge_directives() {
        let mut t = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}}});
        strategic_merge(&mut t, &json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}})).unwrap();
        assert_eq!(t["metadata"]["finalizers"], json!(["b", "c"]));
        strategic_merge(
            &mut t,
            &json!({"metadata": {"labels": {"$patch": "replace", "z": "3"}}}),
        )
        .unwrap();
        assert_eq!(t["metadata"]["labels"], json!({"z": "3"}));
        assert!(
            strategic_merge(
                &mut t,
                &json!({"spec": {"containers": [{"image": "noname"}]}})
            )
            .is_ok()
        );
        let mut with_list = json!({"spec": {"containers": [{"name": "a"}]}});
        assert!(matches!(
            strategic_merge(
                &mut with_list,
                &json!({"spec": {"containers": [{"image": "noname"}]}})
            ),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json"),
            Some(PatchKind::Merge)
        );
        assert_eq!(
            PatchKind::from_content_type("application/apply-patch+yaml; charset=utf-8"),
            Some(PatchKind::Apply)
        );
        assert_eq!(PatchKind::from_content_type("application/json"), None);
    }
}
