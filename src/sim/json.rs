//! A JSON pointer lookup that does not allocate: the simulator reads paths such as
//! `/status/state/phase` on every write, and `serde_json::Value::pointer` allocates for each segment.

use serde_json::Value;

/// Reading a value by JSON pointer (RFC 6901: `~1` is `/`, `~0` is `~`).
pub trait JsonPath {
    /// The value at `path` (`""` is the value itself), or `None`.
    fn at(&self, path: &str) -> Option<&Value>;
}

impl JsonPath for Value {
    fn at(&self, path: &str) -> Option<&Value> {
        if path.is_empty() {
            return Some(self);
        }
        let rest = path.strip_prefix('/')?;
        let mut cur = self;
        for token in rest.split('/') {
            cur = if token.contains('~') {
                let key = token.replace("~1", "/").replace("~0", "~");
                step(cur, &key)?
            } else {
                step(cur, token)?
            };
        }
        Some(cur)
    }
}

fn step<'a>(v: &'a Value, token: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(token),
        Value::Array(a) => {
            if token.len() > 1 && token.starts_with('0') {
                return None;
            }
            a.get(token.parse::<usize>().ok()?)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn agrees_with_serde_json_pointer() {
        let v = json!({"a": {"b/c": [1, {"d~e": 2}]}, "metadata": {"labels": {"volcano.sh/job-name": "j"}}});
        for p in [
            "",
            "/a",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/d~0e",
            "/a/missing",
            "/a/b~1c/9",
            "/a/b~1c/01",
            "/metadata/labels/volcano.sh~1job-name",
            "no-slash",
        ] {
            assert_eq!(v.at(p), v.pointer(p), "{p}");
        }
    }
}
