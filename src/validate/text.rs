//! Bounds on the free text of inbound messages. Everything a message carries ends up somewhere with a
//! limit of its own: annotations on the VolcanoJob (256 KiB in all), a pod's command and environment, an
//! event's status (an AMQP frame), a log line. Unbounded text would fail there, late and far from the
//! message (a 300 KB cancel reason made the job's annotation patch fail with 422). So every string field
//! has a bound, the same in the JSON Schemas (`maxLength`) and here, and a longer one is refused at
//! validation with the field named. (A cancel's reason is the exception: it is cut, never refused, so a
//! cancel always cancels; see [`CANCEL_REASON_MAX`].)

use serde_json::Value;

use super::ValidationError;

/// Names and identifiers: owners, products, applications, parameters, variables, resource ids, titles.
pub const NAME_MAX: usize = 256;
/// Anything else: descriptions, prefixes and suffixes, flags, enumeration values, addresses.
pub const TEXT_MAX: usize = 4096;
/// A container image reference (`application.image`), as the schema's `ImageReference` bounds it.
pub const IMAGE_MAX: usize = 512;
/// Text and textarea parameter values, and the words of an invocation (a word may be a whole script).
pub const LONG_TEXT_MAX: usize = 65_536;
/// What is kept of a cancel's reason (on the job, in the tombstone and in CANCELLED). A longer reason is
/// cut to this many characters and marked with `…`, not refused.
pub const CANCEL_REASON_MAX: usize = 1024;

/// The bound of the string at `path` in a SubmitJob (a JSON path as validation errors name fields:
/// `application.parameters[2].title`, `parameters.threads.text`).
pub fn submit_limit(path: &str) -> usize {
    let generic = generic_path(path);
    let last = generic.rsplit('.').next().unwrap_or_default();
    if generic.starts_with("parameters.") && matches!(last, "text" | "textarea") {
        return LONG_TEXT_MAX;
    }
    if generic.starts_with("application.invocation[].") && last == "word" {
        return LONG_TEXT_MAX;
    }
    if generic == "application.image" {
        return IMAGE_MAX;
    }
    match last {
        "user" | "project" | "name" | "version" | "title" | "id" | "category" | "variableName"
        | "variableNames[]" | "vncPassword" => NAME_MAX,
        _ => TEXT_MAX,
    }
}

/// `path` with indices removed (`a[3].b` → `a[].b`) and parameter names replaced, so rules match it.
fn generic_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    // parameters.<name>.<kind>... → parameters.*.<kind>...
    if let Some(rest) = out.strip_prefix("parameters.")
        && let Some((_, tail)) = rest.split_once('.')
    {
        return format!("parameters.*.{tail}");
    }
    out
}

/// Checks every string of a message (as proto3 JSON) against `limit(path)`, and every map key against
/// [`NAME_MAX`]. The error names the field and both lengths.
pub fn check(message: &Value, limit: impl Fn(&str) -> usize) -> Result<(), ValidationError> {
    walk(message, &mut String::new(), &limit)
}

fn walk(
    value: &Value,
    path: &mut String,
    limit: &impl Fn(&str) -> usize,
) -> Result<(), ValidationError> {
    match value {
        Value::String(s) => {
            let max = limit(path);
            let len = s.chars().count();
            if len > max {
                return Err(ValidationError::invalid(
                    path.as_str(),
                    format!("is {len} characters long; at most {max} are allowed"),
                ));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let before = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, path, limit)?;
                path.truncate(before);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let before = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                if key.chars().count() > NAME_MAX {
                    return Err(ValidationError::invalid(
                        path.as_str(),
                        format!(
                            "the key is {} characters long; at most {NAME_MAX} are allowed",
                            key.chars().count()
                        ),
                    ));
                }
                walk(item, path, limit)?;
                path.truncate(before);
            }
        }
        _ => {}
    }
    Ok(())
}

/// A cancel's reason as it is kept: trimmed, and cut to [`CANCEL_REASON_MAX`] characters (the last one
/// `…`) when longer.
pub fn cancel_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.chars().count() <= CANCEL_REASON_MAX {
        return reason.to_owned();
    }
    let mut cut: String = reason.chars().take(CANCEL_REASON_MAX - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_by_field() {
        assert_eq!(submit_limit("parameters.notes.textarea"), LONG_TEXT_MAX);
        assert_eq!(submit_limit("parameters.threads.text"), LONG_TEXT_MAX);
        assert_eq!(
            submit_limit("application.invocation[3].word.word"),
            LONG_TEXT_MAX
        );
        assert_eq!(submit_limit("application.parameters[2].title"), NAME_MAX);
        assert_eq!(submit_limit("owner.user"), NAME_MAX);
        assert_eq!(submit_limit("application.image"), IMAGE_MAX);
        assert_eq!(
            submit_limit("application.parameters[2].description"),
            TEXT_MAX
        );
        assert_eq!(
            submit_limit("application.invocation[1].var.prefixGlobal"),
            TEXT_MAX
        );
    }

    #[test]
    fn a_long_string_is_named_by_its_path() {
        let message = json!({"owner": {"user": "a".repeat(NAME_MAX + 1)}, "x": ["ok"]});
        let e = check(&message, submit_limit).unwrap_err();
        assert_eq!(e.field(), "owner.user");
        assert!(
            e.message().contains("257 characters long; at most 256"),
            "{e}"
        );
        let fine = json!({"owner": {"user": "a".repeat(NAME_MAX)}, "list": [{"title": "t"}]});
        assert_eq!(check(&fine, submit_limit), Ok(()));
        let e = check(&json!({"application": {"invocation": [{"word": {"word": "x"}}, {"var": {"prefixGlobal": "p".repeat(TEXT_MAX + 1)}}]}}), submit_limit).unwrap_err();
        assert_eq!(e.field(), "application.invocation[1].var.prefixGlobal");
    }

    #[test]
    fn cancel_reasons_are_cut_not_refused() {
        assert_eq!(cancel_reason("  user asked  "), "user asked");
        let long = "x".repeat(300_000);
        let kept = cancel_reason(&long);
        assert_eq!(kept.chars().count(), CANCEL_REASON_MAX);
        assert!(kept.ends_with('…'));
    }
}
