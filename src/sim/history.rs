//! The watch history's entries, and what a change costs to keep (issue 46).
//!
//! A change is made as a [`Record`] holding the object's JSON tree and the tree before the change:
//! the controllers read those, and every watch open at the time matches and sends it from them (its
//! watch line written once and shared). Kept longer as trees, the history cost about 20 KiB per change
//! (an older version's tree is held by nothing else), and at the benchmark's rates its 100,000-change
//! cap bound before its window of time did: some 2 GiB. Once a change is older than
//! [`COMPACT_AFTER`] (every watch open when it was made has sent it by then, unless it lags), the
//! history keeps it as a [`Compact`] record instead: its watch line (the exact text every watch sends),
//! and of the object after and before the change only what selectors read ([`Selectable`]: labels and
//! the resource's selectable fields), shared with the record before it when unchanged. A watch that
//! resumes from an older version gets exactly what it got from the trees: the event type from the
//! selectable values, the shared line as it is, and the rare rest (metadata only, another apiVersion,
//! the object as it was before a change that took it out of a selection) by reading the text again.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::Value;

use super::encode::{EventType, ObjectKey, Record, field_text, stamped, watch_line};
use super::encode::{MetaSpan, line_object, write_partial_from};
use super::selector::{FieldSelector, LabelSelector};

/// How long a change stays in the history as trees before it is compacted: long enough that every
/// watch open when it was made has sent it from the shared line (a watch wakes within milliseconds of
/// a write), short enough that the trees held meanwhile stay a few MiB at the benchmark's rates.
pub const COMPACT_AFTER: Duration = Duration::from_secs(1);

/// What label and field selectors read of an object: its labels and its resource's selectable fields
/// (as a field selector reads them: a missing field or null is empty, a string as is, anything else
/// as its JSON).
#[derive(Debug, PartialEq, Eq)]
pub struct Selectable {
    labels: Box<[(Box<str>, Box<str>)]>,
    fields: Box<[(&'static str, Box<str>)]>,
}

impl Selectable {
    /// Reads `obj`'s labels (string values only, as selectors read them) and `fields`.
    pub fn of(obj: &Value, fields: &[&'static str]) -> Selectable {
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|l| {
                l.iter()
                    .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default();
        let fields = fields
            .iter()
            .map(|f| (*f, field_text(obj, f).into_boxed_str()))
            .collect();
        Selectable { labels, fields }
    }

    /// Whether `obj` reads as these values ([`Selectable::of`] would give an equal one), found
    /// without building them: an object's changes nearly always leave its labels and selectable
    /// fields as they were, and the history then shares the values of the change before.
    pub fn describes(&self, obj: &Value, fields: &[&'static str]) -> bool {
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let mut strings = labels
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)));
        let same_labels = self
            .labels
            .iter()
            .all(|(k, v)| strings.next() == Some((&**k, &**v)))
            && strings.next().is_none();
        same_labels
            && self.fields.len() == fields.len()
            && self
                .fields
                .iter()
                .zip(fields)
                .all(|((name, v), f)| name == f && field_is(obj, f, v))
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(name, _)| &**name == key)
            .map(|(_, v)| &**v)
    }

    /// A selectable field's value (empty for a field that is not one of them).
    pub fn field(&self, field: &str) -> &str {
        self.fields
            .iter()
            .find(|(name, _)| *name == field)
            .map_or("", |(_, v)| &**v)
    }

    /// Whether both selectors match.
    pub fn matches(&self, label: &LabelSelector, field: &FieldSelector) -> bool {
        label.matches_by(|k| self.label(k)) && field.matches_by(|f| self.field(f))
    }

    /// What it takes on the heap, about.
    pub fn bytes(&self) -> usize {
        let labels: usize = self
            .labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + 32)
            .sum();
        let fields: usize = self.fields.iter().map(|(_, v)| v.len() + 24).sum();
        labels + fields + 48
    }
}

/// Whether a field reads as `text` to a field selector ([`field_text`] without its copy).
fn field_is(obj: &Value, field: &str, text: &str) -> bool {
    let mut cur = obj;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return text.is_empty(),
        }
    }
    match cur {
        Value::String(s) => s == text,
        Value::Null => text.is_empty(),
        // A number's or a boolean's text (or any other value's JSON), as a selector reads it.
        other => displays_as(other, text),
    }
}

/// Whether `value` displays as `text`, compared while it is written rather than written to a copy
/// first: [`Selectable::describes`] runs for every change of every object.
fn displays_as(value: &impl std::fmt::Display, text: &str) -> bool {
    /// What is left of the text to match; writing stops at the first difference.
    struct Rest<'a>(&'a str);

    impl std::fmt::Write for Rest<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 = self.0.strip_prefix(s).ok_or(std::fmt::Error)?;
            Ok(())
        }
    }

    let mut rest = Rest(text);
    std::fmt::write(&mut rest, format_args!("{value}")).is_ok() && rest.0.is_empty()
}

/// A change the history keeps without its trees (see the module's documentation).
#[derive(Debug)]
pub struct Compact {
    pub rv: u64,
    pub at: Instant,
    pub key: ObjectKey,
    pub kind: EventType,
    /// The watch line of the change's own event type, the whole object as every watch sends it.
    pub line: Bytes,
    /// Its metadata-only line, cut from `line` when a watch asks for it.
    metadata_line: OnceLock<Bytes>,
    /// Where the object's `metadata` lies in `line`.
    meta: Option<MetaSpan>,
    /// The object's `apiVersion`, when it is one that some watch could be served another in.
    api_version: Option<Box<str>>,
    /// What selectors read of the object after the change, and before it (`None` for a creation).
    pub now: Arc<Selectable>,
    pub before: Option<Arc<Selectable>>,
    /// The object before the change, as JSON at its own version: kept only when the change moved
    /// what selectors read (only then can a watch see it leave its selection, as a DELETED event
    /// carrying it); usually a slice of the previous change's line, not a copy.
    pub prev_json: Option<Bytes>,
    /// Whether `prev_json` is its own text rather than a slice of another line.
    prev_own: bool,
}

impl Compact {
    /// The compacted form of a fresh record: `line` is its own whole watch line, `now` and `before`
    /// what selectors read after and before, `prev_json` the object before when they differ.
    pub fn new(
        r: &Record,
        line: Bytes,
        now: Arc<Selectable>,
        before: Option<Arc<Selectable>>,
        prev_json: Option<Bytes>,
        prev_own: bool,
    ) -> Compact {
        Compact {
            rv: r.rv,
            at: r.at(),
            key: r.key.clone(),
            kind: r.kind,
            meta: r.line_meta(),
            line,
            metadata_line: OnceLock::new(),
            api_version: r
                .object
                .get("apiVersion")
                .and_then(Value::as_str)
                .map(Into::into),
            now,
            before,
            prev_json,
            prev_own,
        }
    }

    /// The object as sent, as JSON (a slice of the line).
    pub fn object_json(&self) -> Bytes {
        line_object(&self.line, self.kind.as_str())
    }

    fn parse(json: &[u8]) -> Value {
        serde_json::from_slice(json).expect("the history holds JSON the store wrote")
    }

    /// The metadata-only line: the line's `metadata` copied between a fixed head and tail (a watch
    /// of metadata that lags behind the compaction asks this of every change it sends; reading the
    /// text's `metadata` back into a tree and writing it again was most of its cost, and before that
    /// parsing whole objects).
    fn own_metadata_line(&self) -> &Bytes {
        self.metadata_line.get_or_init(|| {
            let meta = self.meta.map(|m| m.of(&self.line));
            watch_line(
                self.kind.as_str(),
                meta.map_or(2, <[u8]>::len) + 80,
                |out| write_partial_from(out, meta),
            )
        })
    }

    /// What it takes on the heap besides what it shares, about: its line, the selectable values'
    /// share of them, and the earlier object's text when it is its own.
    pub fn bytes(&self) -> usize {
        let share = |s: &Arc<Selectable>| s.bytes() / Arc::strong_count(s).max(1);
        self.line.len()
            + self.metadata_line.get().map_or(0, Bytes::len)
            + share(&self.now)
            + self.before.as_ref().map_or(0, share)
            + if self.prev_own {
                self.prev_json.as_ref().map_or(0, Bytes::len)
            } else {
                0
            }
            + std::mem::size_of::<Compact>()
            + self.key.namespace.len()
            + self.key.name.len()
    }
}

/// One change in the watch history: fresh (with its trees) or compacted.
#[derive(Debug, Clone)]
pub enum Change {
    Fresh(Arc<Record>),
    Compact(Arc<Compact>),
}

impl Change {
    /// The change's resourceVersion.
    pub fn rv(&self) -> u64 {
        match self {
            Change::Fresh(r) => r.rv,
            Change::Compact(c) => c.rv,
        }
    }

    /// The changed object's key.
    pub fn key(&self) -> &ObjectKey {
        match self {
            Change::Fresh(r) => &r.key,
            Change::Compact(c) => &c.key,
        }
    }

    /// What happened to the object.
    pub fn kind(&self) -> EventType {
        match self {
            Change::Fresh(r) => r.kind,
            Change::Compact(c) => c.kind,
        }
    }

    /// When the change was made.
    pub fn at(&self) -> Instant {
        match self {
            Change::Fresh(r) => r.at(),
            Change::Compact(c) => c.at,
        }
    }

    /// Whether the object after the change matches both selectors.
    pub fn matches_now(&self, label: &LabelSelector, field: &FieldSelector) -> bool {
        match self {
            Change::Fresh(r) => label.matches_object(&r.object) && field.matches(&r.object),
            Change::Compact(c) => c.now.matches(label, field),
        }
    }

    /// Whether the object before the change matched both selectors (`false` for a creation).
    pub fn matched_before(&self, label: &LabelSelector, field: &FieldSelector) -> bool {
        match self {
            Change::Fresh(r) => r
                .prev
                .as_ref()
                .is_some_and(|p| label.matches_object(p) && field.matches(p)),
            Change::Compact(c) => c.before.as_ref().is_some_and(|b| b.matches(label, field)),
        }
    }

    /// Whether the object is stored in `api_version` (else a watch of another version rewrites it).
    pub fn in_version(&self, api_version: &str) -> bool {
        match self {
            Change::Fresh(r) => {
                r.object.get("apiVersion").and_then(Value::as_str) == Some(api_version)
            }
            Change::Compact(c) => c.api_version.as_deref() == Some(api_version),
        }
    }

    /// The change as a watch event of type `ty`, the whole object or (`metadata`) its
    /// `PartialObjectMetadata`: the shared line when `ty` is the change's own type.
    pub fn event_line(&self, ty: &str, metadata: bool) -> Bytes {
        match self {
            Change::Fresh(r) => r.event_line(ty, metadata),
            Change::Compact(c) => {
                let own = if metadata {
                    c.own_metadata_line()
                } else {
                    &c.line
                };
                if ty == c.kind.as_str() {
                    return own.clone();
                }
                let object = line_object(own, c.kind.as_str());
                watch_line(ty, object.len(), |out| out.extend_from_slice(&object))
            }
        }
    }

    /// The object (or its `PartialObjectMetadata`) as JSON as its own event type sends it: a slice of
    /// its shared line.
    pub fn object_json(&self, metadata: bool) -> Bytes {
        let kind = self.kind();
        line_object(&self.event_line(kind.as_str(), metadata), kind.as_str())
    }

    /// The object as sent (at the change's version).
    pub fn sent_object(&self) -> Value {
        match self {
            Change::Fresh(r) => r.sent_object(),
            Change::Compact(c) => Compact::parse(&c.object_json()),
        }
    }

    /// `f` of the object as it was before the change and the change's version (see
    /// [`Change::before_at_change`]), without a copy of the object stamped with that version: a
    /// watch writes it at the version as it goes.
    pub fn with_before<R>(&self, f: impl FnOnce(&Value, &str) -> R) -> Option<R> {
        let rv = self.rv().to_string();
        match self {
            Change::Fresh(r) => r.prev.as_ref().map(|p| f(p, &rv)),
            Change::Compact(c) => c
                .prev_json
                .as_ref()
                .map(|json| f(&Compact::parse(json), &rv)),
        }
    }

    /// The object as it was before the change, at the change's version: what a watch whose selection
    /// the change took it out of gets as a DELETED event. `None` for a creation (and, once compacted,
    /// for a change that could not take the object out of any selection).
    pub fn before_at_change(&self) -> Option<Value> {
        let rv = self.rv().to_string();
        match self {
            Change::Fresh(r) => r.prev.as_ref().map(|p| stamped(p, &rv)),
            // Without `prev_json` the change left what selectors read as it was, so no watch's
            // selection lost the object through it.
            Change::Compact(c) => c
                .prev_json
                .as_ref()
                .map(|json| stamped(&Compact::parse(json), &rv)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::store::Store;
    use serde_json::json;

    const FIELDS: &[&str] = &["status.phase", "spec.nodeName"];

    /// One object's life: created, scheduled (a selectable field), relabelled, an unselectable
    /// change, finished, removed; and a second object so that the last change of the first is
    /// compacted too.
    fn life(s: &mut Store) {
        s.set_selectable_fields(0, FIELDS);
        let key = ObjectKey::new(0, "ns", "p");
        let mut pod = json!({
            "apiVersion": "v1",
            "metadata": {"name": "p", "namespace": "ns", "uid": "U", "labels": {"app": "x", "n": 1}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending"}
        });
        s.put(key.clone(), pod.clone());
        pod["spec"]["nodeName"] = json!("node-1");
        s.put(key.clone(), pod.clone());
        pod["metadata"]["labels"]["app"] = json!("y");
        s.put(key.clone(), pod.clone());
        pod["status"]["podIP"] = json!("10.0.0.1");
        s.put(key.clone(), pod.clone());
        pod["status"]["phase"] = json!("Succeeded");
        s.put(key.clone(), pod.clone());
        s.remove(&key);
        s.put(
            ObjectKey::new(0, "ns", "q"),
            json!({"apiVersion": "v1", "metadata": {"name": "q", "namespace": "ns"}}),
        );
        s.put(
            ObjectKey::new(1, "", "other"),
            json!({"metadata": {"name": "other"}}),
        );
    }

    fn history(compact: bool) -> (Store, Vec<Change>) {
        let mut s = Store::new(100, 1);
        if compact {
            s.set_compact_after(Duration::ZERO);
        }
        life(&mut s);
        let mut changes = s.history_after(0, 0, 100).unwrap();
        changes.retain(|c| c.key().res == 0);
        (s, changes)
    }

    #[test]
    fn a_compacted_change_sends_exactly_what_it_sent_whole() {
        let (_fresh_store, fresh) = history(false);
        let (_store, compact) = history(true);
        assert!(fresh.iter().all(|c| matches!(c, Change::Fresh(_))));
        assert!(
            compact.iter().all(|c| matches!(c, Change::Compact(_))),
            "every change of kind 0 was followed by another"
        );
        assert_eq!(fresh.len(), 7);
        let selectors: Vec<(LabelSelector, FieldSelector)> = [
            ("", ""),
            ("app=x", ""),
            ("app!=x", ""),
            ("n", ""),
            ("", "spec.nodeName=node-1"),
            ("", "status.phase!=Succeeded,status.phase!=Failed"),
            ("app=y", "metadata.name=p"),
            ("", "metadata.namespace=other"),
        ]
        .iter()
        .map(|(l, f)| {
            (
                LabelSelector::parse(l).unwrap(),
                FieldSelector::parse(f, FIELDS).unwrap(),
            )
        })
        .collect();
        let mut left = 0;
        for (a, b) in fresh.iter().zip(&compact) {
            assert_eq!((a.rv(), a.key(), a.kind()), (b.rv(), b.key(), b.kind()));
            for ty in ["ADDED", "MODIFIED", "DELETED"] {
                for metadata in [false, true] {
                    assert_eq!(
                        a.event_line(ty, metadata),
                        b.event_line(ty, metadata),
                        "rv {} {ty} metadata {metadata}",
                        a.rv()
                    );
                }
            }
            assert_eq!(a.sent_object(), b.sent_object());
            assert_eq!(a.in_version("v1"), b.in_version("v1"));
            assert_eq!(a.in_version("v2"), b.in_version("v2"));
            for (label, field) in &selectors {
                let now = a.matches_now(label, field);
                let before = a.matched_before(label, field);
                assert_eq!(now, b.matches_now(label, field), "rv {}", a.rv());
                assert_eq!(before, b.matched_before(label, field), "rv {}", a.rv());
                if before && !now && a.kind() == EventType::Modified {
                    left += 1;
                    let was = a.before_at_change().unwrap();
                    assert_eq!(Some(&was), b.before_at_change().as_ref());
                    // Written at the version as it goes: the same bytes as the stamped copy.
                    for c in [a, b] {
                        let whole = c.with_before(|p, rv| {
                            let mut out = Vec::new();
                            crate::sim::encode::write_object(&mut out, p, Some(rv));
                            out
                        });
                        assert_eq!(whole, Some(serde_json::to_vec(&was).unwrap()));
                        let partial = c.with_before(|p, rv| {
                            let mut out = Vec::new();
                            crate::sim::encode::write_partial_metadata(&mut out, p, Some(rv));
                            out
                        });
                        let mut expected = Vec::new();
                        crate::sim::encode::write_partial_metadata(&mut expected, &was, None);
                        assert_eq!(partial, Some(expected));
                    }
                    assert_eq!(was["metadata"]["resourceVersion"], a.rv().to_string());
                }
            }
        }
        assert!(
            left >= 2,
            "changes took the object out of selections: {left}"
        );
    }

    #[test]
    fn describes_agrees_with_comparing_what_selectors_read() {
        let objects = [
            json!({"metadata": {"labels": {"app": "x", "n": 1}}, "spec": {"nodeName": "a"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "a"}}),
            json!({"metadata": {"labels": {"app": "x", "b": "y"}}, "spec": {"nodeName": "a"}}),
            json!({"metadata": {"labels": {"app": "y"}}, "spec": {"nodeName": "a"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": null}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": 3}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "3"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": 31}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "31"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": -2.5}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "-2.5"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": true}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "true"}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": false}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": ["é", 1]}}),
            json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "[\"é\",1]"}}),
            json!({"metadata": {}, "status": {"phase": "Running"}}),
            json!({"metadata": {"labels": null}, "status": {"phase": "Running"}}),
            json!({}),
        ];
        for a in &objects {
            let sel = Selectable::of(a, FIELDS);
            for b in &objects {
                assert_eq!(
                    sel.describes(b, FIELDS),
                    sel == Selectable::of(b, FIELDS),
                    "{a} against {b}"
                );
            }
            assert!(!sel.describes(a, &FIELDS[..1]), "other fields");
        }
    }

    #[test]
    fn a_compacted_change_shares_what_did_not_change() {
        let (store, compact) = history(true);
        let c: Vec<&Compact> = compact
            .iter()
            .map(|c| match c {
                Change::Compact(c) => &**c,
                Change::Fresh(_) => panic!("compacted"),
            })
            .collect();
        // Scheduling moved a selectable field: the object before is kept, as a slice of the
        // creation's line (no copy).
        let before = c[1].prev_json.as_ref().unwrap();
        assert!(c[0].line.as_ptr_range().contains(&before.as_ptr()));
        assert!(!c[1].prev_own);
        // A change selectors do not see keeps no earlier object, and one set of selectable values.
        assert!(c[3].prev_json.is_none());
        assert!(Arc::ptr_eq(&c[3].now, c[3].before.as_ref().unwrap()));
        assert!(
            Arc::ptr_eq(&c[3].now, &c[2].now),
            "shared with the change before"
        );
        // A removal keeps the last state it carries.
        assert_eq!(c[5].kind, EventType::Deleted);
        assert!(c[5].prev_json.is_none());
        let f = store.footprint();
        let (_, fresh) = history(false);
        let whole: usize = fresh
            .iter()
            .map(|c| match c {
                Change::Fresh(r) => crate::sim::store::tree_bytes(&r.object),
                Change::Compact(_) => 0,
            })
            .sum();
        let compacted: usize = c.iter().map(|c| c.bytes()).sum();
        assert!(
            compacted * 2 < whole,
            "compacted {compacted} bytes against trees of {whole}; {f:?}"
        );
    }
}
