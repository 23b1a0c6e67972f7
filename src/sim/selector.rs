//! Label selectors (equality, set-based, exists) and field selectors, parsed and matched as the API
//! server does for `?labelSelector=` and `?fieldSelector=`.

use std::collections::BTreeSet;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn check_key(key: &str) -> Result<(), String> {
    let errs = super::names::qualified_name(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key {key:?}: {}",
            errs.join("; ")
        ))
    }
}

fn check_value(value: &str) -> Result<(), String> {
    let errs = super::names::label_value(value);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label value: {value:?}: {}",
            errs.join("; ")
        ))
    }
}

fn parse_set(key: &str, rest: &str) -> Result<BTreeSet<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement: found '{rest}', expected: '(' for the values of {key:?}"))?;
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        let v = v.trim();
        check_value(v)?;
        set.insert(v.to_string());
    }
    Ok(set)
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(
                    "unable to parse requirement: found '', expected: identifier".to_string(),
                );
            }
            if let Some(key) = part.strip_prefix('!') {
                let key = key.trim();
                check_key(key)?;
                reqs.push(Requirement::DoesNotExist(key.to_string()));
                continue;
            }
            if let Some((k, v)) = part.split_once("!=") {
                let (k, v) = (k.trim(), v.trim());
                check_key(k)?;
                check_value(v)?;
                reqs.push(Requirement::NotEquals(k.to_string(), v.to_string()));
                continue;
            }
            if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                let (k, v) = (k.trim(), v.trim());
                check_key(k)?;
                check_value(v)?;
                reqs.push(Requirement::Equals(k.to_string(), v.to_string()));
                continue;
            }
            let tokens: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
            if tokens.len() == 2 {
                let key = tokens[0].trim();
                let rest = tokens[1].trim();
                check_key(key)?;
                if let Some(set) = rest.strip_prefix("notin") {
                    reqs.push(Requirement::NotIn(key.to_string(), parse_set(key, set)?));
                    continue;
                }
                if let Some(set) = rest.strip_prefix("in") {
                    reqs.push(Requirement::In(key.to_string(), parse_set(key, set)?));
                    continue;
                }
                return Err(format!(
                    "unable to parse requirement: found '{rest}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
            if let Some((k, v)) = part.split_once('>') {
                let n = v.trim().parse().map_err(|_| format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {v}"))?;
                check_key(k.trim())?;
                reqs.push(Requirement::GreaterThan(k.trim().to_string(), n));
                continue;
            }
            if let Some((k, v)) = part.split_once('<') {
                let n = v.trim().parse().map_err(|_| format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {v}"))?;
                check_key(k.trim())?;
                reqs.push(Requirement::LessThan(k.trim().to_string(), n));
                continue;
            }
            check_key(part)?;
            reqs.push(Requirement::Exists(part.to_string()));
        }
        Ok(Self(reqs))
    }

    /// Whether `obj`'s `metadata.labels` satisfy every requirement. An empty selector (most watches and
    /// lists) matches without looking the labels up: the simulator asks this of every stored change.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.0.is_empty()
            || self.matches(
                obj.get("metadata")
                    .and_then(|m| m.get("labels"))
                    .and_then(Value::as_object),
            )
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        self.matches_by(|k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Whether the labels `get` reads satisfy every requirement.
    pub fn matches_by<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
            Requirement::GreaterThan(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Requirement::LessThan(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    /// Matches against a `{key: value}` map given as a structured `matchLabels` + `matchExpressions`
    /// selector (Service, NetworkPolicy): builds the requirement list from it.
    pub fn from_structured(sel: &Value) -> Self {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Requirement::Equals(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        if let Some(list) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in list {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let values: BTreeSet<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                match e.get("operator").and_then(Value::as_str) {
                    Some("In") => reqs.push(Requirement::In(key, values)),
                    Some("NotIn") => reqs.push(Requirement::NotIn(key, values)),
                    Some("Exists") => reqs.push(Requirement::Exists(key)),
                    Some("DoesNotExist") => reqs.push(Requirement::DoesNotExist(key)),
                    _ => {}
                }
            }
        }
        Self(reqs)
    }
}

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector such as `metadata.name=j-1,status.phase!=Running`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldTerm>);

impl FieldSelector {
    /// Parses the selector and checks each field against the ones the kind supports (`allowed`), with
    /// the API server's message for the others.
    pub fn parse(s: &str, allowed: &[&str]) -> Result<Self, String> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(terms));
        }
        for part in s.split(',') {
            let part = part.trim();
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !allowed.contains(&field)
            {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push(FieldTerm {
                field: field.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(Self(terms))
    }

    /// Whether the object's fields satisfy every term. A missing field reads as the empty string.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|t| {
            let mut cur = obj;
            let mut found = true;
            for seg in t.field.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let actual = if !found {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }
            };
            (actual == t.value) != t.negated
        })
    }

    /// Whether the field values `get` reads (as a field selector reads them: a missing field is
    /// empty) satisfy every term.
    pub fn matches_by<S: AsRef<str>>(&self, get: impl Fn(&str) -> S) -> bool {
        self.0
            .iter()
            .all(|t| (get(&t.field).as_ref() == t.value) != t.negated)
    }

    /// The value an equality term pins `field` to, if any (to narrow a list to one namespace or name).
    pub fn pinned(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|t| t.field == field && !t.negated)
            .map(|t| t.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn an_object_is_matched_by_its_metadata_labels() {
        let labelled = json!({"metadata": {"name": "a", "labels": {"app": "x"}}});
        let bare = json!({"metadata": {"name": "b"}});
        let everything = LabelSelector::parse("").unwrap();
        assert!(everything.matches_object(&labelled));
        assert!(everything.matches_object(&bare));
        assert!(everything.matches_object(&json!({})), "no metadata at all");
        let app = LabelSelector::parse("app=x").unwrap();
        assert!(app.matches_object(&labelled));
        assert!(!app.matches_object(&bare));
        let not_app = LabelSelector::parse("!app").unwrap();
        assert!(!not_app.matches_object(&labelled));
        assert!(not_app.matches_object(&bare));
    }

    #[test]
    fn equality_set_and_exists() {
        let l = labels(json!({"app": "x", "tier": "db", "volcano.sh/job-name": "j-1"}));
        let yes = [
            "app=x",
            "app==x",
            "app!=y",
            "tier in (db, web)",
            "tier notin (web)",
            "volcano.sh/job-name",
            "!missing",
            "app=x,tier in (db),!gone",
            "",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(Some(&l)), "{s}");
        }
        let no = [
            "app=y",
            "tier in (web)",
            "tier notin (db)",
            "missing",
            "!app",
            "app=x,tier=web",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(Some(&l)), "{s}");
        }
        assert!(
            LabelSelector::parse("missing notin (a)")
                .unwrap()
                .matches(Some(&l))
        );
    }

    #[test]
    fn bad_selectors_are_errors() {
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
    }

    #[test]
    fn field_selectors() {
        let obj =
            json!({"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}});
        let sel = FieldSelector::parse("metadata.name=p,status.phase!=Failed", &["status.phase"])
            .unwrap();
        assert!(sel.matches(&obj));
        let sel = FieldSelector::parse("metadata.namespace==other", &[]).unwrap();
        assert!(!sel.matches(&obj));
        assert_eq!(
            FieldSelector::parse("spec.foo=1", &[]).unwrap_err(),
            "field label not supported: spec.foo"
        );
    }
}
