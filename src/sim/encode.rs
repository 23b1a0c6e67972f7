//! How the simulator writes its objects out: a change's [`Record`] with its watch line (written once,
//! lazily, and shared by every watch and by the answer to the write), the `PartialObjectMetadata` of an
//! object, and the keys and event types every part of the store speaks in. Below the store and its
//! history, which both build on it.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::registry::ResId;

/// What happened to an object, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// Identifies an object: storage resource type, namespace (empty for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub res: ResId,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    /// A key; `namespace` is empty for cluster-scoped objects.
    pub fn new(res: ResId, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            res,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// A change as it is made, shared (`Arc`) by the controllers' queue, the history (until it is
/// compacted, see [`Change`]) and every watch that sends it.
#[derive(Debug)]
pub struct Record {
    pub rv: u64,
    /// When the change was made (the history keeps a window of time, see `Store::set_window`).
    at: Instant,
    pub key: ObjectKey,
    pub kind: EventType,
    pub object: Arc<Value>,
    /// The object before this change (for watches with selectors: an object that stops matching is
    /// reported as DELETED, one that starts matching as ADDED).
    pub prev: Option<Arc<Value>>,
    /// The record's watch line (`{"type":...,"object":...}` and a newline, with the event type of
    /// `kind`), and the same for its metadata alone, each written once by the first watch that sends
    /// the record and shared by the others (a reference count, not a copy): every change goes to
    /// several watches (a runner's job watch, its metadata watch, the benchmark's observer), and
    /// writing or copying the same object again for each was the simulator's largest cost under load.
    /// The object's JSON alone (a write's answer, an event of another type) is a slice of the line.
    line: OnceLock<Line>,
    metadata_line: OnceLock<Bytes>,
}

/// A written watch line and where the object's `metadata` lies in it.
#[derive(Debug)]
struct Line {
    bytes: Bytes,
    meta: Option<MetaSpan>,
}

/// Where an object's `metadata` value lies in a text holding the object (byte offsets, end
/// excluded): a metadata-only line or list item is that slice copied between a fixed head and tail,
/// not the metadata written again from a tree or, once only the text is left, read back from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaSpan {
    start: u32,
    end: u32,
}

impl MetaSpan {
    /// The span as found `by` bytes further on (`by` negative: earlier), in a text that starts
    /// elsewhere.
    pub fn shifted(self, by: isize) -> Option<MetaSpan> {
        let at = |x: u32| u32::try_from(isize::try_from(x).ok()? + by).ok();
        Some(MetaSpan {
            start: at(self.start)?,
            end: at(self.end)?,
        })
    }

    /// The metadata's JSON in `text` (the text the span was found in).
    pub fn of<'a>(&self, text: &'a [u8]) -> &'a [u8] {
        &text[self.start as usize..self.end as usize]
    }
}

/// What a `PartialObjectMetadata` holds before its metadata.
const PARTIAL_HEAD: &[u8] =
    br#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":"#;

/// A `PartialObjectMetadata` whose metadata is `meta`, the JSON of an object's metadata as written
/// in its text (`None`: the object has none), byte for byte what [`write_partial_metadata`] writes
/// from the object itself.
pub fn write_partial_from(out: &mut Vec<u8>, meta: Option<&[u8]>) {
    out.extend_from_slice(PARTIAL_HEAD);
    out.extend_from_slice(meta.unwrap_or(b"{}"));
    out.push(b'}');
}

/// Writes `obj` as JSON exactly as `serde_json::to_writer(out, &AtVersion(obj, rv))` does, the
/// top-level object by hand so as to tell where its `metadata` value lies in `out`.
pub fn write_object(out: &mut Vec<u8>, obj: &Value, rv: Option<&str>) -> Option<MetaSpan> {
    let Value::Object(top) = obj else {
        let _ = serde_json::to_writer(&mut *out, obj);
        return None;
    };
    let mut meta = None;
    out.push(b'{');
    for (i, (k, v)) in top.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        let start = out.len();
        match (v, rv) {
            (Value::Object(m), Some(rv)) if k == "metadata" => {
                let _ = serde_json::to_writer(&mut *out, &MetaAt(m, rv));
            }
            _ => {
                let _ = serde_json::to_writer(&mut *out, v);
            }
        }
        if k == "metadata" {
            meta = Some((start, out.len()));
        }
    }
    out.push(b'}');
    let (start, end) = meta?;
    Some(MetaSpan {
        start: u32::try_from(start).ok()?,
        end: u32::try_from(end).ok()?,
    })
}

/// What a watch line holds before the object: `{"type":"MODIFIED","object":`.
fn line_head(ty: &str) -> usize {
    LINE_HEAD_START.len() + ty.len() + LINE_HEAD_END.len()
}

const LINE_HEAD_START: &[u8] = b"{\"type\":\"";
const LINE_HEAD_END: &[u8] = b"\",\"object\":";
const LINE_TAIL: &[u8] = b"}\n";

/// The object in a watch line of type `ty` (a slice of it, not a copy).
pub fn line_object(line: &Bytes, ty: &str) -> Bytes {
    line.slice(line_head(ty)..line.len() - LINE_TAIL.len())
}

thread_local! {
    /// Where watch lines are written before they are copied out at their exact size.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer grown past this by a large object is let go after it (rather than held by the
/// thread for good).
const SCRATCH_KEEP: usize = 64 * 1024;

/// One line of a watch stream, `{"type":ty,"object":...}` and a newline, with the object written by
/// `write`. Written into a per-thread scratch buffer and copied out at its exact size: a line is kept
/// with its change in the history, and a buffer sized by a guess (4 KiB for an object) and handed
/// over as it was held a few KiB unused per change, more than the line itself for most objects.
pub fn watch_line(ty: &str, capacity: usize, write: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    watch_line_with(ty, capacity, write).0
}

/// [`watch_line`], with what `write` tells of what it wrote (offsets into `out` are offsets into
/// the line).
fn watch_line_with<R>(
    ty: &str,
    capacity: usize,
    write: impl FnOnce(&mut Vec<u8>) -> R,
) -> (Bytes, R) {
    SCRATCH.with_borrow_mut(|out| {
        out.clear();
        out.reserve(capacity + line_head(ty) + LINE_TAIL.len());
        out.extend_from_slice(LINE_HEAD_START);
        out.extend_from_slice(ty.as_bytes());
        out.extend_from_slice(LINE_HEAD_END);
        let told = write(out);
        out.extend_from_slice(LINE_TAIL);
        let line = Bytes::copy_from_slice(out);
        if out.capacity() > SCRATCH_KEEP {
            *out = Vec::new();
        }
        (line, told)
    })
}

impl Record {
    /// The change to `key` made at `rv`, its lines not written yet.
    pub fn new(
        rv: u64,
        at: Instant,
        key: ObjectKey,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        Self {
            rv,
            at,
            key,
            kind,
            object,
            prev,
            line: OnceLock::new(),
            metadata_line: OnceLock::new(),
        }
    }

    /// When the change was made.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Bytes of the lines written so far (the store's footprint).
    pub fn line_bytes(&self) -> usize {
        self.line.get().map_or(0, |l| l.bytes.len())
            + self.metadata_line.get().map_or(0, Bytes::len)
    }

    /// The version the object is sent with when it differs from the one it holds: a DELETED record
    /// holds the removed object's last stored state (not a copy), whose `metadata.resourceVersion` is
    /// the one before the removal; what is sent says `rv` instead.
    pub fn version(&self) -> Option<String> {
        (self.kind == EventType::Deleted).then(|| self.rv.to_string())
    }

    /// Whether what is sent is `object` exactly (not a removal sent at a later version).
    pub fn sends_as_stored(&self) -> bool {
        self.kind != EventType::Deleted
    }

    /// The record as a watch line of its own event type, the whole object or (`metadata`) its
    /// metadata as a `PartialObjectMetadata`, written once for all watches that send it so.
    ///
    /// The metadata-only line is cut from the whole one (its `metadata` copied, not written again):
    /// the whole line is written anyway, for a watch or, at the latest, when the change is compacted.
    pub fn own_line(&self, metadata: bool) -> &Bytes {
        let ty = self.kind.as_str();
        let line = self.line.get_or_init(|| {
            let version = self.version();
            let (bytes, meta) = watch_line_with(ty, 4096, |out| {
                write_object(out, &self.object, version.as_deref())
            });
            Line { bytes, meta }
        });
        if !metadata {
            return &line.bytes;
        }
        self.metadata_line.get_or_init(|| {
            let meta = line.meta.map(|m| m.of(&line.bytes));
            watch_line(
                ty,
                meta.map_or(2, <[u8]>::len) + PARTIAL_HEAD.len() + 1,
                |out| write_partial_from(out, meta),
            )
        })
    }

    /// Where the object's `metadata` lies in its whole watch line, once written.
    pub fn line_meta(&self) -> Option<MetaSpan> {
        self.line.get()?.meta
    }

    /// Where the object's `metadata` lies in its JSON ([`Record::object_json`]), once written.
    pub fn meta_span(&self) -> Option<MetaSpan> {
        let line = self.line.get()?;
        line.meta?
            .shifted(-isize::try_from(line_head(self.kind.as_str())).ok()?)
    }

    /// The object (or its `PartialObjectMetadata`) as JSON: a slice of its watch line, not a copy.
    pub fn object_json(&self, metadata: bool) -> Bytes {
        line_object(self.own_line(metadata), self.kind.as_str())
    }

    /// The record as a watch event of type `ty`: its shared line when `ty` is its own type (nearly
    /// always), else a new line around the same object (a watch with a selector sees an object that
    /// starts or stops matching as ADDED or DELETED).
    pub fn event_line(&self, ty: &str, metadata: bool) -> Bytes {
        if ty == self.kind.as_str() {
            return self.own_line(metadata).clone();
        }
        let object = self.object_json(metadata);
        watch_line(ty, object.len(), |out| out.extend_from_slice(&object))
    }

    /// The object as sent: with this record's version when it was removed.
    pub fn sent_object(&self) -> Value {
        match self.version() {
            Some(v) => stamped(&self.object, &v),
            None => (*self.object).clone(),
        }
    }
}

/// A copy of `obj` at resourceVersion `rv`.
pub fn stamped(obj: &Value, rv: &str) -> Value {
    let mut copy = obj.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.into()));
    }
    copy
}

/// An object written as JSON with `metadata.resourceVersion` replaced when a version is given, without
/// copying it.
pub struct AtVersion<'a>(pub &'a Value, pub Option<&'a str>);

impl Serialize for AtVersion<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.0, self.1) {
            (Value::Object(top), Some(rv)) => {
                let mut map = s.serialize_map(Some(top.len()))?;
                for (k, v) in top {
                    match v {
                        Value::Object(meta) if k == "metadata" => {
                            map.serialize_entry(k, &MetaAt(meta, rv))?
                        }
                        _ => map.serialize_entry(k, v)?,
                    }
                }
                map.end()
            }
            (obj, _) => obj.serialize(s),
        }
    }
}

struct MetaAt<'a>(&'a serde_json::Map<String, Value>, &'a str);

impl Serialize for MetaAt<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            if k == "resourceVersion" {
                map.serialize_entry(k, self.1)?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// Writes `obj` as a `PartialObjectMetadata` in JSON (what metadata-only reads and watches get)
/// straight from its metadata, without copying it, at resourceVersion `rv` when given.
pub fn write_partial_metadata(out: &mut Vec<u8>, obj: &Value, rv: Option<&str>) {
    out.extend_from_slice(PARTIAL_HEAD);
    let _ = match (obj.get("metadata"), rv) {
        (Some(Value::Object(meta)), Some(rv)) => {
            serde_json::to_writer(&mut *out, &MetaAt(meta, rv))
        }
        (Some(meta), _) => serde_json::to_writer(&mut *out, meta),
        (None, _) => serde_json::to_writer(&mut *out, &serde_json::Map::new()),
    };
    out.push(b'}');
}

/// A field as a field selector reads it: a string as is, a missing field or null as empty, any other
/// value as its JSON.
pub fn field_text(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_object_is_written_as_serde_json_writes_it_and_its_metadata_is_found_in_it() {
        let objects = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "resourceVersion": "3",
                   "labels": {"a\"b": "c\\d", "é": "\u{1}"}}, "spec": {"x": [1, 2.5, null, true]},
                   "status": {}}),
            json!({"metadata": {"name": "only"}}),
            json!({"a": 1, "z": {"metadata": "not the top one"}}),
            json!({"metadata": null, "b": "x"}),
            json!({}),
            json!([1, {"metadata": {}}]),
            json!("text"),
        ];
        for obj in &objects {
            for rv in [None, Some("42")] {
                let expected = serde_json::to_vec(&AtVersion(obj, rv)).unwrap();
                let mut out = b"prefix".to_vec();
                let span = write_object(&mut out, obj, rv);
                assert_eq!(&out[6..], &expected[..], "{obj} at {rv:?}");
                let mut partial = Vec::new();
                write_partial_metadata(&mut partial, obj, rv);
                let mut cut = Vec::new();
                write_partial_from(&mut cut, span.map(|m| m.of(&out)));
                assert_eq!(
                    String::from_utf8(cut).unwrap(),
                    String::from_utf8(partial).unwrap(),
                    "{obj} at {rv:?}"
                );
            }
        }
    }
}
