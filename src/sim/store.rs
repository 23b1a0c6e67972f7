//! The object store: every object as JSON, one global increasing `resourceVersion`, a bounded history of
//! changes for watches, and indices by uid and by owner for garbage collection.
//!
//! The store is synchronous and knows nothing of HTTP or validation; the API layer above it decides
//! what to write. Of time it knows only how long its history of changes is kept (the API server's
//! watch cache keeps a window of recent changes, not every change since it started).
//!
//! What it costs per object. A JSON tree (`serde_json::Value`) takes several times the object's text:
//! every JSON object in it is a B-tree node of its own (about 640 bytes, however few its fields), so a
//! pod of 5 KiB of JSON takes some 40 KiB as a tree. Objects that are only kept to be read until they
//! are deleted (a finished pod, an ended VolcanoJob, an Event: the rules are the API layer's, see
//! [`KeepRule`]) are therefore stored as their JSON text, with the labels and selectable fields lists
//! and watches filter on, and parsed again only when read. A simulator that runs jobs for hours keeps
//! every ended job for its `ttlSecondsAfterFinished` (a day), as an API server keeps them in etcd; kept
//! as trees they made it grow by over 100 KiB per job.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::sim::json::JsonPath;
use axum::body::Bytes;
use serde_json::Value;

use super::encode::{EventType, MetaSpan, ObjectKey, Record, field_text, line_object, stamped};
use super::history::{COMPACT_AFTER, Change, Compact, Selectable};
use super::registry::ResId;
use super::selector::{FieldSelector, LabelSelector};

/// Per storage resource type: namespace → name → object.
type Objects = BTreeMap<String, BTreeMap<String, Entry>>;

/// A stored object: a JSON tree while it may still change, or, once only kept to be read (see
/// [`KeepRule`]), its JSON text.
#[derive(Debug, Clone)]
pub enum Entry {
    Tree(Arc<Value>),
    Kept(Arc<Kept>),
}

/// An object kept as its JSON text (the one its last change's watch line holds, shared with it), with
/// what lists and watches filter on: its labels and the values of its resource's selectable fields.
#[derive(Debug)]
pub struct Kept {
    json: Bytes,
    /// Where its `metadata` lies in `json` (lists of metadata cut it from there).
    meta: Option<MetaSpan>,
    /// Its `apiVersion` (a list in that version sends `json` as it is).
    api_version: Option<Box<str>>,
    sel: Arc<Selectable>,
    /// Whether the object carries a `deletionTimestamp` (the garbage collector asks, of every owner
    /// of every object it deletes).
    deleting: bool,
    /// The tree this text was written from or last parsed into, while anything else holds it (the
    /// history's fresh change, a write in progress): a read then shares it rather than parsing the
    /// text again. A patch of an ended job read it, and its write read it again for the change's
    /// earlier version, and the job's controller once more: parsing kept objects was a quarter of
    /// the benchmark process's instructions. Holds no tree of its own (a dead `Weak` costs the
    /// tree's top value, 48 bytes, until the next read lets it go).
    tree: Mutex<Weak<Value>>,
}

/// Deeper than this, an object stays a tree: serde_json parses at most 128 levels, and a kept object
/// must parse again.
const MAX_KEPT_DEPTH: usize = 100;

fn depth(v: &Value) -> usize {
    match v {
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

impl Kept {
    /// What it takes on the heap, about.
    fn bytes(&self) -> usize {
        self.json.len() + self.sel.bytes() + self.api_version.as_ref().map_or(0, |v| v.len()) + 64
    }
}

impl Entry {
    /// The object as a JSON tree: shared when it is one; when kept as text, the tree it was last
    /// read as while that is still held, else parsed again.
    pub fn object(&self) -> Arc<Value> {
        match self {
            Entry::Tree(v) => v.clone(),
            Entry::Kept(k) => {
                let mut tree = k.tree.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(t) = tree.upgrade() {
                    return t;
                }
                let t = Arc::new(
                    serde_json::from_slice(&k.json).expect("a kept object is JSON the store wrote"),
                );
                *tree = Arc::downgrade(&t);
                t
            }
        }
    }

    /// A kept object's JSON, when it is stored in `api_version`: what a list or a watch in that
    /// version sends of it, as it is (not parsed and written again). `None` for a tree.
    pub fn text_in(&self, api_version: &str) -> Option<&Bytes> {
        match self {
            Entry::Kept(k) if k.api_version.as_deref() == Some(api_version) => Some(&k.json),
            _ => None,
        }
    }

    /// A kept object's `metadata` as JSON (`Some(None)` when it has none), cut from its text.
    /// `None` for a tree.
    pub fn text_metadata(&self) -> Option<Option<&[u8]>> {
        match self {
            Entry::Kept(k) => Some(k.meta.map(|m| m.of(&k.json))),
            Entry::Tree(_) => None,
        }
    }

    /// Whether the object carries a `metadata.deletionTimestamp`, without parsing a kept one.
    pub fn deleting(&self) -> bool {
        match self {
            Entry::Tree(v) => v.at("/metadata/deletionTimestamp").is_some(),
            Entry::Kept(k) => k.deleting,
        }
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        match self {
            Entry::Tree(v) => v
                .get("metadata")
                .and_then(|m| m.get("labels"))
                .and_then(|l| l.get(key))
                .and_then(Value::as_str),
            Entry::Kept(k) => k.sel.label(key),
        }
    }

    /// Whether the object's labels and fields satisfy both selectors, without parsing an object kept as
    /// text.
    pub fn selected_by(&self, labels: &LabelSelector, fields: &FieldSelector) -> bool {
        labels.matches_by(|k| self.label(k)) && fields.matches_by(|f| self.field(f))
    }

    /// A field as a field selector reads it (`metadata.name`, `status.phase`, ...). A kept object
    /// answers for its resource's selectable fields and its name and namespace.
    pub fn field(&self, field: &str) -> String {
        match self {
            Entry::Tree(v) => field_text(v, field),
            Entry::Kept(k) => k.sel.field(field).to_string(),
        }
    }
}

/// When objects of one resource are kept as text rather than as trees: once they will only be read
/// (and, rarely, relabelled) until deleted.
#[derive(Debug, Clone)]
pub struct KeepRule {
    /// Kept when the field at this JSON pointer holds one of these values; always when `None`.
    pub when: Option<(&'static str, &'static [&'static str])>,
    /// The selectable fields lists and watches may filter them by (besides labels).
    pub fields: Vec<&'static str>,
}

impl KeepRule {
    fn applies(&self, obj: &Value) -> bool {
        match self.when {
            None => true,
            Some((pointer, values)) => obj
                .at(pointer)
                .and_then(Value::as_str)
                .is_some_and(|v| values.contains(&v)),
        }
    }
}

/// What the store holds, about (heap bytes estimated from the objects' shapes, not measured): for
/// tests and the benchmark's soak lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Objects stored.
    pub objects: usize,
    /// Of them, kept as text.
    pub kept: usize,
    /// Bytes of the stored objects (trees and texts).
    pub object_bytes: usize,
    /// Changes in the watch history.
    pub history: usize,
    /// Bytes the history holds besides the stored objects: earlier versions' trees and written lines
    /// (estimated from one change in 16).
    pub history_bytes: usize,
}

/// About what a JSON tree takes on the heap: a B-tree leaf per object (11 slots of key and value,
/// 640 bytes in jemalloc's size classes) and one more per 11 fields, strings by their length, arrays
/// by their slots.
pub fn tree_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.capacity(),
        Value::Array(a) => {
            a.capacity() * std::mem::size_of::<Value>() + a.iter().map(tree_bytes).sum::<usize>()
        }
        Value::Object(m) => {
            let nodes = m.len().div_ceil(11).max(1);
            nodes * 640
                + m.iter()
                    .map(|(k, v)| k.capacity() + tree_bytes(v))
                    .sum::<usize>()
        }
        _ => 0,
    }
}

/// The changes the history keeps however old they are (a real API server's watch cache keeps at least
/// 100 per resource): a simulator that is quiet for a while still lets watches resume.
pub const HISTORY_FLOOR: usize = 100;

/// [`Store::footprint`] estimates the history's bytes from one change in this many.
const HISTORY_SAMPLE: usize = 16;

/// The in-memory object store.
#[derive(Debug)]
pub struct Store {
    objects: Vec<Objects>,
    rv: u64,
    history: VecDeque<Change>,
    /// The index in `history` of its first change not yet compacted (the ones before it are).
    fresh_from: usize,
    /// How long a change stays whole in the history before it is compacted.
    compact_after: Duration,
    /// Per object whose last compacted change is still in the history: that change's version, its
    /// object's JSON (a slice of its line) and what selectors read of it, which the object's next
    /// change shares rather than keeping its own.
    recent: FastMap<ObjectKey, Recent>,
    /// Per resource: the selectable fields besides the name and namespace (what compacted changes
    /// keep for field selectors).
    fields: Vec<Vec<&'static str>>,
    /// The latest change (a write's answer is its line).
    last: Option<Arc<Record>>,
    history_cap: usize,
    /// How long a change stays in the history (besides the last [`HISTORY_FLOOR`]); `None` keeps up to
    /// `history_cap` however old.
    window: Option<Duration>,
    /// Per resource: when its objects are kept as text.
    rules: Vec<Option<KeepRule>>,
    /// The resourceVersion of the last `compact` (an etcd compaction): every watch from before it is
    /// gone, whatever its kind.
    compacted_all: u64,
    /// Per resource: the newest resourceVersion of its records that left the history. A watch of one
    /// kind expires only when its own changes are gone, as a real API server's watch cache is kept per
    /// resource: a busy kind does not push a quiet kind's watches into 410 Gone and a relist.
    dropped: Vec<u64>,
    /// Per resource: the resourceVersion of its latest change (so a watch of a quiet kind skips the
    /// history of the busy ones).
    last_change: Vec<u64>,
    /// Resources changed since [`Store::take_touched`]: the server wakes only their watches.
    touched: Vec<ResId>,
    uid_state: u64,
    /// Changes not yet seen by the controllers (drained by the model after each write).
    changes: Vec<Arc<Record>>,
    uids: FastMap<String, ObjectKey>,
    /// Owner uid → objects whose ownerReferences name it.
    dependents: FastMap<String, BTreeSet<ObjectKey>>,
    /// Who is told of every object of a kind as it is created ([`Store::tap_created`]).
    taps: Vec<(ResId, CreatedSender)>,
}

/// A map hashed quickly (foldhash, with a random seed per map): the store and the model look
/// objects up by key, uid and owner several times per change, and SipHash over a namespace and a
/// name cost more than the lookup.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The name of an object just created and when it was stored ([`Store::tap_created`]).
pub type Created = (String, Instant);
type CreatedSender = tokio::sync::mpsc::UnboundedSender<Created>;

/// An object's last compacted change (see [`Store::recent`]).
#[derive(Debug)]
struct Recent {
    rv: u64,
    json: Bytes,
    sel: Arc<Selectable>,
}

/// The fields every object can be selected by.
const NAME_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

/// `metadata.uid` of an object, if any.
pub fn uid_of(obj: &Value) -> Option<&str> {
    obj.at("/metadata/uid").and_then(Value::as_str)
}

/// The owner uids in `metadata.ownerReferences`.
pub fn owner_uids(obj: &Value) -> Vec<String> {
    obj.at("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A per-resource figure (0 for a resource that never had one).
fn at(per_res: &[u64], res: ResId) -> u64 {
    per_res.get(res).copied().unwrap_or(0)
}

fn set(per_res: &mut Vec<u64>, res: ResId, value: u64) {
    if per_res.len() <= res {
        per_res.resize(res + 1, 0);
    }
    per_res[res] = value;
}

impl Store {
    /// An empty store; `seed` makes generated uids differ between simulators and repeat between runs.
    pub fn new(history_cap: usize, seed: u64) -> Self {
        Self {
            objects: Vec::new(),
            rv: 0,
            history: VecDeque::new(),
            fresh_from: 0,
            compact_after: COMPACT_AFTER,
            recent: FastMap::default(),
            fields: Vec::new(),
            last: None,
            history_cap: history_cap.max(1),
            window: None,
            rules: Vec::new(),
            compacted_all: 0,
            dropped: Vec::new(),
            last_change: Vec::new(),
            touched: Vec::new(),
            uid_state: seed,
            changes: Vec::new(),
            uids: FastMap::default(),
            dependents: FastMap::default(),
            taps: Vec::new(),
        }
    }

    /// Tells the receiver the name of every object stored in `res` from now on as it is created, with
    /// the instant it was stored, until the receiver is dropped. For an observer in the same process
    /// (the benchmark's harness): a watch would have this process write, send and decode every later
    /// change of every such object too, on the cores it measures.
    pub fn tap_created(&mut self, res: ResId) -> tokio::sync::mpsc::UnboundedReceiver<Created> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.taps.push((res, tx));
        rx
    }

    fn slot(&mut self, res: ResId) -> &mut Objects {
        if self.objects.len() <= res {
            self.objects.resize_with(res + 1, BTreeMap::new);
        }
        &mut self.objects[res]
    }

    /// Keeps changes in the history for `window` (and at least the last [`HISTORY_FLOOR`]), as a
    /// real cluster's etcd is compacted every 5 minutes: a watch that
    /// resumes from an older version gets 410 Gone and lists again.
    pub fn set_window(&mut self, window: Duration) {
        self.window = Some(window);
    }

    /// How long a change stays whole in the history before it is compacted ([`COMPACT_AFTER`]
    /// unless set; tests compact at once with zero).
    pub fn set_compact_after(&mut self, after: Duration) {
        self.compact_after = after;
    }

    /// The fields objects of `res` can be selected by besides their name and namespace (what a
    /// compacted change keeps for field selectors); none unless set.
    pub fn set_selectable_fields(&mut self, res: ResId, fields: &[&'static str]) {
        if self.fields.len() <= res {
            self.fields.resize(res + 1, Vec::new());
        }
        let all = &mut self.fields[res];
        for f in NAME_FIELDS.iter().chain(fields) {
            if !all.contains(f) {
                all.push(f);
            }
        }
    }

    /// Objects of `res` that `rule` applies to are kept as text from their next write on.
    pub fn keep_as_text(&mut self, res: ResId, rule: KeepRule) {
        if self.rules.len() <= res {
            self.rules.resize(res + 1, None);
        }
        let mut rule = rule;
        for f in ["metadata.name", "metadata.namespace"] {
            if !rule.fields.contains(&f) {
                rule.fields.push(f);
            }
        }
        self.rules[res] = Some(rule);
    }

    /// What the store holds (a walk over every object: for tests and reports, not for hot paths).
    pub fn footprint(&self) -> Footprint {
        let mut f = Footprint::default();
        let mut stored: HashSet<*const Value> = HashSet::new();
        // Texts kept for objects: a compacted change's line holds the same bytes.
        let mut kept_texts: HashSet<*const u8> = HashSet::new();
        for names in self.objects.iter().flat_map(BTreeMap::values) {
            for entry in names.values() {
                f.objects += 1;
                f.object_bytes += match entry {
                    Entry::Tree(v) => {
                        stored.insert(Arc::as_ptr(v));
                        tree_bytes(v)
                    }
                    Entry::Kept(k) => {
                        f.kept += 1;
                        kept_texts.insert(k.json.as_ptr());
                        k.bytes()
                    }
                };
            }
        }
        // The history's bytes from every `HISTORY_SAMPLE`th change: walking every tree of a hundred
        // thousand changes held the store's lock for seconds (the soak lines read this every so often).
        f.history = self.history.len();
        let mut counted: HashSet<*const Value> = HashSet::new();
        let mut sampled = 0;
        for change in self.history.iter().step_by(HISTORY_SAMPLE) {
            match change {
                Change::Fresh(r) => {
                    for v in std::iter::once(&r.object).chain(r.prev.as_ref()) {
                        let ptr = Arc::as_ptr(v);
                        if !stored.contains(&ptr) && counted.insert(ptr) {
                            sampled += tree_bytes(v);
                        }
                    }
                    sampled += r.line_bytes() + 128;
                }
                Change::Compact(c) => {
                    // A line shared with a kept object is counted there; the earlier object's text
                    // is its own only when it is not a slice of another change's line.
                    let shared_line = kept_texts.contains(&c.object_json().as_ptr());
                    sampled += c.bytes() - if shared_line { c.line.len() } else { 0 };
                }
            }
        }
        f.history_bytes = sampled * HISTORY_SAMPLE;
        f
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The newest resourceVersion no longer in the history (list continue tokens from before it are
    /// too old).
    pub fn compacted(&self) -> u64 {
        let dropped = self.dropped.iter().copied().max().unwrap_or(0);
        self.compacted_all.max(dropped)
    }

    /// The oldest resourceVersion a watch of `res` may resume from: none of the kind's changes after
    /// it has left the history, and no compaction came after it.
    pub fn watchable_from(&self, res: ResId) -> u64 {
        self.compacted_all.max(at(&self.dropped, res))
    }

    /// The resources changed since the last call (the server wakes their watches).
    pub fn take_touched(&mut self) -> Vec<ResId> {
        std::mem::take(&mut self.touched)
    }

    /// A fresh uid in the usual 8-4-4-4-12 shape, deterministic for a given seed.
    pub fn next_uid(&mut self) -> String {
        self.uid_state = self.uid_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.uid_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let a = z ^ (z >> 31);
        let b = a.rotate_left(23).wrapping_mul(0x2545_F491_4F6C_DD1D);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            a as u16 & 0x0fff,
            (b >> 48) as u16 & 0x3fff | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    /// The stored object: shared (watch history and lists hold the same `Arc`), or parsed from its
    /// text when it is kept as text.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.entry(key).map(Entry::object)
    }

    /// Whether an object is stored under `key`.
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.entry(key).is_some()
    }

    /// The stored entry (tree or text).
    pub fn entry(&self, key: &ObjectKey) -> Option<&Entry> {
        self.objects
            .get(key.res)?
            .get(&key.namespace)?
            .get(&key.name)
    }

    /// The objects of one type named `name`, in one namespace or all, in namespace order, starting after
    /// `after` (a `(namespace, name)` pair from a continue token). A direct lookup per namespace: a list
    /// with `fieldSelector=metadata.name=...` (how a client finds a job whose namespace it does not know)
    /// costs the number of namespaces, not the number of objects.
    pub fn named<'a>(
        &'a self,
        res: ResId,
        namespace: Option<&'a str>,
        name: &'a str,
        after: Option<(&'a str, &'a str)>,
    ) -> Box<dyn Iterator<Item = &'a Entry> + 'a> {
        let Some(objects) = self.objects.get(res) else {
            return Box::new(std::iter::empty());
        };
        let after_key = move |ns: &str| match after {
            Some((ans, aname)) => ns > ans || (ns == ans && name > aname),
            None => true,
        };
        match namespace {
            Some(ns) => Box::new(
                objects
                    .get(ns)
                    .and_then(|names| names.get(name))
                    .filter(move |_| after_key(ns))
                    .into_iter(),
            ),
            None => Box::new(
                objects
                    .iter()
                    .filter(move |(ns, _)| after_key(ns.as_str()))
                    .filter_map(move |(_, names)| names.get(name)),
            ),
        }
    }

    /// Objects of one type, in one namespace or all, in (namespace, name) order, starting after
    /// `after` (a `(namespace, name)` pair from a continue token).
    pub fn list<'a>(
        &'a self,
        res: ResId,
        namespace: Option<&'a str>,
        after: Option<(&'a str, &'a str)>,
    ) -> Box<dyn Iterator<Item = &'a Entry> + 'a> {
        let Some(objects) = self.objects.get(res) else {
            return Box::new(std::iter::empty());
        };
        match namespace {
            Some(ns) => {
                let Some(names) = objects.get(ns) else {
                    return Box::new(std::iter::empty());
                };
                match after {
                    Some((_, name)) => Box::new(
                        names
                            .range::<str, _>((
                                std::ops::Bound::Excluded(name),
                                std::ops::Bound::Unbounded,
                            ))
                            .map(|(_, v)| v),
                    ),
                    None => Box::new(names.values()),
                }
            }
            None => Box::new(
                objects
                    .iter()
                    .filter(move |(ns, _)| after.is_none_or(|(ans, _)| ns.as_str() >= ans))
                    .flat_map(move |(ns, names)| {
                        names.iter().filter(move |(name, _)| match after {
                            Some((ans, aname)) => ns.as_str() > ans || name.as_str() > aname,
                            None => true,
                        })
                    })
                    .map(|(_, v)| v),
            ),
        }
    }

    /// Number of objects of one type in a namespace (or all).
    pub fn count(&self, res: ResId, namespace: Option<&str>) -> usize {
        let Some(objects) = self.objects.get(res) else {
            return 0;
        };
        match namespace {
            Some(ns) => objects.get(ns).map_or(0, BTreeMap::len),
            None => objects.values().map(BTreeMap::len).sum(),
        }
    }

    /// The names of the objects of one type in one namespace, in order.
    pub fn names_in(&self, res: ResId, namespace: &str) -> Vec<String> {
        self.objects
            .get(res)
            .and_then(|o| o.get(namespace))
            .map(|names| names.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Namespaces that hold objects of a type.
    pub fn namespaces_of(&self, res: ResId) -> Vec<String> {
        self.objects
            .get(res)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn record(
        &mut self,
        key: ObjectKey,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Arc<Record> {
        let at = Instant::now();
        let record = Arc::new(Record::new(self.rv, at, key, kind, object, prev));
        let res = record.key.res;
        set(&mut self.last_change, res, record.rv);
        if !self.touched.contains(&res) {
            self.touched.push(res);
        }
        if kind == EventType::Added && !self.taps.is_empty() {
            let name = &record.key.name;
            self.taps
                .retain(|(tapped, tx)| *tapped != res || tx.send((name.clone(), at)).is_ok());
        }
        self.changes.push(record.clone());
        self.compact_older_than(at);
        self.history.push_back(Change::Fresh(record.clone()));
        self.last = Some(record.clone());
        let expired = |r: &Change| {
            self.window
                .is_some_and(|w| at.saturating_duration_since(r.at()) > w)
        };
        while self.history.len() > self.history_cap
            || (self.history.len() > HISTORY_FLOOR && self.history.front().is_some_and(&expired))
        {
            if let Some(old) = self.history.pop_front() {
                self.fresh_from = self.fresh_from.saturating_sub(1);
                set(&mut self.dropped, old.key().res, old.rv());
                if self.recent.get(old.key()).is_some_and(|r| r.rv == old.rv()) {
                    self.recent.remove(old.key());
                }
            }
        }
        record
    }

    /// Compacts the history's changes made more than `compact_after` before `now`, oldest first.
    fn compact_older_than(&mut self, now: Instant) {
        while let Some(Change::Fresh(r)) = self.history.get(self.fresh_from) {
            if now.saturating_duration_since(r.at()) < self.compact_after {
                break;
            }
            let r = r.clone();
            let compact = self.compact_record(&r);
            self.history[self.fresh_from] = Change::Compact(Arc::new(compact));
            self.fresh_from += 1;
        }
    }

    /// A change without its trees: its line, what selectors read of the object after and before it
    /// (shared with the object's previous change when equal), and the object before it only when
    /// what selectors read moved (then usually a slice of the previous change's line).
    fn compact_record(&mut self, r: &Record) -> Compact {
        let fields: &[&'static str] = self
            .fields
            .get(r.key.res)
            .map_or(&NAME_FIELDS[..], Vec::as_slice);
        let line = r.own_line(false).clone();
        let recent = self.recent.remove(&r.key);
        let share = |sel: Selectable| match &recent {
            Some(last) if *last.sel == sel => last.sel.clone(),
            _ => Arc::new(sel),
        };
        let now = match &recent {
            Some(last) if last.sel.describes(&r.object, fields) => last.sel.clone(),
            _ => share(Selectable::of(&r.object, fields)),
        };
        let (before, prev_json, prev_own) = match &r.prev {
            None => (None, None, false),
            Some(p) if Arc::ptr_eq(p, &r.object) => (Some(now.clone()), None, false),
            Some(p) => {
                // The previous change's object is the one before this change when its version is
                // the one the earlier tree carries: then what selectors read of it is known already.
                let version = p.at("/metadata/resourceVersion").and_then(Value::as_str);
                let previous = recent
                    .as_ref()
                    .filter(|last| version == Some(last.rv.to_string().as_str()));
                let before = match previous {
                    Some(last) => last.sel.clone(),
                    None if now.describes(p, fields) => now.clone(),
                    None => share(Selectable::of(p, fields)),
                };
                if Arc::ptr_eq(&before, &now) || *before == *now {
                    (Some(now.clone()), None, false)
                } else {
                    let (json, own) = match previous {
                        Some(last) => (last.json.clone(), false),
                        None => (
                            Bytes::from(serde_json::to_vec(&**p).unwrap_or_default()),
                            true,
                        ),
                    };
                    (Some(before), Some(json), own)
                }
            }
        };
        if r.kind != EventType::Deleted {
            self.recent.insert(
                r.key.clone(),
                Recent {
                    rv: r.rv,
                    json: line_object(&line, r.kind.as_str()),
                    sel: now.clone(),
                },
            );
        }
        Compact::new(r, line, now, before, prev_json, prev_own)
    }

    fn index(&mut self, key: &ObjectKey, old: Option<&Value>, new: Option<&Value>) {
        if let (Some(o), Some(n)) = (old, new)
            && o.at("/metadata/ownerReferences") == n.at("/metadata/ownerReferences")
            && uid_of(o) == uid_of(n)
        {
            return;
        }
        let old_owners: BTreeSet<String> = old
            .map(owner_uids)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let new_owners: BTreeSet<String> = new
            .map(owner_uids)
            .unwrap_or_default()
            .into_iter()
            .collect();
        for gone in old_owners.difference(&new_owners) {
            if let Some(set) = self.dependents.get_mut(gone) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(gone);
                }
            }
        }
        for added in new_owners.difference(&old_owners) {
            self.dependents
                .entry(added.clone())
                .or_default()
                .insert(key.clone());
        }
        if let Some(uid) = old.and_then(uid_of)
            && new.and_then(uid_of) != Some(uid)
        {
            self.uids.remove(uid);
        }
        if let Some(uid) = new.and_then(uid_of) {
            self.uids.insert(uid.to_string(), key.clone());
        }
    }

    /// Writes an object (create or replace), giving it the next resourceVersion. Returns the stored
    /// object (the tree, also when it is stored as text: the history holds the tree while it keeps the
    /// change).
    pub fn put(&mut self, key: ObjectKey, mut object: Value) -> Arc<Value> {
        self.rv += 1;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        }
        let object = Arc::new(object);
        let old = self
            .slot(key.res)
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.name.clone(), Entry::Tree(object.clone()))
            .map(|e| e.object());
        self.index(&key, old.as_deref(), Some(&object));
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        let record = self.record(key, kind, object.clone(), old);
        if let Some(Some(rule)) = self.rules.get(record.key.res)
            && rule.applies(&object)
            && depth(&object) <= MAX_KEPT_DEPTH
        {
            // The text is the one watches send (written once, shared with them).
            let json = record.object_json(false);
            let kept = Kept {
                json,
                meta: record.meta_span(),
                api_version: object
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .map(Into::into),
                sel: Arc::new(Selectable::of(&object, &rule.fields)),
                deleting: object.at("/metadata/deletionTimestamp").is_some(),
                tree: Mutex::new(Arc::downgrade(&object)),
            };
            let key = &record.key;
            if let Some(slot) = self
                .objects
                .get_mut(key.res)
                .and_then(|o| o.get_mut(&key.namespace))
                .and_then(|n| n.get_mut(&key.name))
            {
                *slot = Entry::Kept(Arc::new(kept));
            }
        }
        object
    }

    /// Removes an object and returns its last stored state. The DELETED event carries that state with
    /// the removal's resourceVersion (written so when sent: the object is not copied); a caller that
    /// shows the removed object uses [`Store::removed_at`] for the same.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Arc<Value>> {
        let objects = self.objects.get_mut(key.res)?;
        let names = objects.get_mut(&key.namespace)?;
        let old = names.remove(&key.name)?.object();
        if names.is_empty() {
            objects.remove(&key.namespace);
        }
        self.rv += 1;
        self.index(key, Some(&old), None);
        self.record(
            key.clone(),
            EventType::Deleted,
            old.clone(),
            Some(old.clone()),
        );
        Some(old)
    }

    /// The object just removed by [`Store::remove`], at the removal's resourceVersion.
    pub fn removed_at(&self, last: &Value) -> Arc<Value> {
        Arc::new(stamped(last, &self.rv.to_string()))
    }

    /// The object with this uid, if it exists.
    pub fn by_uid(&self, uid: &str) -> Option<&ObjectKey> {
        self.uids.get(uid)
    }

    /// Objects whose ownerReferences name `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<ObjectKey> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The latest change.
    pub fn latest(&self) -> Option<&Arc<Record>> {
        self.last.as_ref()
    }

    /// Takes the changes made since the last call (for the controllers).
    pub fn take_changes(&mut self) -> Vec<Arc<Record>> {
        std::mem::take(&mut self.changes)
    }

    /// History records after `rv` (at most `max`, of any kind: the caller filters), or `None` when some
    /// of `res`'s are no longer retained (410 Gone); none when `res` has not changed since `rv`.
    pub fn history_after(&self, res: ResId, rv: u64, max: usize) -> Option<Vec<Change>> {
        if rv < self.watchable_from(res) {
            return None;
        }
        if at(&self.last_change, res) <= rv {
            return Some(Vec::new());
        }
        let start = self.history.partition_point(|r| r.rv() <= rv);
        Some(self.history.iter().skip(start).take(max).cloned().collect())
    }

    /// Drops the whole history, as an etcd compaction does: watches from older versions get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.fresh_from = 0;
        self.recent.clear();
        self.compacted_all = self.rv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::encode::write_partial_metadata;
    use serde_json::json;

    fn obj(name: &str, uid: &str, owners: &[&str]) -> Value {
        let refs: Vec<Value> = owners.iter().map(|o| json!({"uid": o})).collect();
        json!({"metadata": {"name": name, "uid": uid, "ownerReferences": refs}})
    }

    #[test]
    fn resource_versions_increase_and_history_is_bounded() {
        let mut s = Store::new(3, 1);
        for i in 0..5 {
            s.put(
                ObjectKey::new(0, "ns", format!("o{i}")),
                obj(&format!("o{i}"), &format!("u{i}"), &[]),
            );
        }
        assert_eq!(s.resource_version(), 5);
        assert_eq!(
            s.get(&ObjectKey::new(0, "ns", "o4")).unwrap()["metadata"]["resourceVersion"],
            "5"
        );
        assert!(
            s.history_after(0, 1, 10).is_none(),
            "rv 1 fell out of a history of 3"
        );
        let after = s.history_after(0, 2, 10).unwrap();
        assert_eq!(
            after.iter().map(|r| r.rv()).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        s.compact();
        assert!(s.history_after(0, 4, 10).is_none());
        assert!(s.history_after(0, 5, 10).unwrap().is_empty());
    }

    #[test]
    fn a_quiet_kind_stays_watchable_while_a_busy_one_rolls_the_history() {
        let (busy, quiet) = (0, 1);
        let mut s = Store::new(3, 1);
        s.put(ObjectKey::new(quiet, "ns", "q"), obj("q", "Q", &[]));
        for i in 0..5 {
            s.put(
                ObjectKey::new(busy, "ns", format!("b{i}")),
                obj("b", "B", &[]),
            );
        }
        assert_eq!(s.take_touched(), vec![quiet, busy]);
        assert!(s.take_touched().is_empty(), "taken once");
        // The quiet kind's one change (rv 1) left the history: a watch from before it is gone, one from
        // after it has lost nothing, though the busy kind's history has moved on since.
        assert!(s.history_after(quiet, 0, 10).is_none());
        assert!(s.history_after(quiet, 1, 10).unwrap().is_empty());
        assert_eq!(s.watchable_from(quiet), 1);
        assert!(
            s.history_after(busy, 1, 10).is_none(),
            "rv 2 of the busy kind is gone"
        );
        assert_eq!(s.watchable_from(busy), 3);
        assert_eq!(s.compacted(), 3, "the newest version gone, of any kind");
        // A change of the quiet kind is found after the busy kind's records before it.
        s.put(ObjectKey::new(quiet, "ns", "q"), obj("q", "Q", &["P"]));
        assert_eq!(s.take_touched(), vec![quiet]);
        let after = s.history_after(quiet, 1, 10).unwrap();
        assert_eq!(
            after.last().map(|r| (r.key().res, r.rv())),
            Some((quiet, 7))
        );
        // A compaction expires every watch from before it, whatever its kind.
        assert_eq!(s.compacted(), 4);
        s.compact();
        assert_eq!(s.compacted(), 7);
        assert!(s.history_after(quiet, 6, 10).is_none());
        assert!(s.history_after(busy, 6, 10).is_none());
        assert!(s.history_after(quiet, 7, 10).unwrap().is_empty());
    }

    #[test]
    fn list_is_ordered_and_resumes_after_a_key() {
        let mut s = Store::new(100, 1);
        for (ns, name) in [("b", "x"), ("a", "z"), ("a", "y"), ("c", "w")] {
            s.put(
                ObjectKey::new(0, ns, name),
                obj(name, &format!("{ns}{name}"), &[]),
            );
        }
        let names = |it: Box<dyn Iterator<Item = &Entry> + '_>| {
            it.map(|o| o.object()["metadata"]["name"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(s.list(0, None, None)), vec!["y", "z", "x", "w"]);
        assert_eq!(names(s.list(0, None, Some(("a", "z")))), vec!["x", "w"]);
        assert_eq!(names(s.list(0, Some("a"), Some(("a", "y")))), vec!["z"]);
        assert_eq!(s.count(0, None), 4);
    }

    #[test]
    fn named_finds_a_name_in_every_namespace_as_a_filtered_list_would() {
        let mut s = Store::new(100, 1);
        for (ns, name) in [("b", "x"), ("a", "x"), ("a", "y"), ("c", "x"), ("c", "w")] {
            s.put(
                ObjectKey::new(0, ns, name),
                obj(name, &format!("{ns}{name}"), &[]),
            );
        }
        let uids = |it: Box<dyn Iterator<Item = &Entry> + '_>| {
            it.map(|o| o.object()["metadata"]["uid"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let filtered = |ns, after| {
            uids(s.list(0, ns, after))
                .into_iter()
                .filter(|u| u.ends_with('x'))
                .collect::<Vec<_>>()
        };
        for (ns, after) in [
            (None, None),
            (None, Some(("a", "x"))),
            (None, Some(("b", "a"))),
            (Some("c"), None),
            (Some("d"), None),
        ] {
            assert_eq!(
                uids(s.named(0, ns, "x", after)),
                filtered(ns, after),
                "{ns:?} {after:?}"
            );
        }
        assert_eq!(uids(s.named(0, None, "x", None)), vec!["ax", "bx", "cx"]);
        assert!(uids(s.named(1, None, "x", None)).is_empty());
    }

    #[test]
    fn owner_index_follows_updates_and_deletes() {
        let mut s = Store::new(100, 1);
        let owner = ObjectKey::new(0, "ns", "owner");
        s.put(owner.clone(), obj("owner", "U", &[]));
        let dep = ObjectKey::new(1, "ns", "dep");
        s.put(dep.clone(), obj("dep", "D", &["U"]));
        assert_eq!(s.dependents_of("U"), vec![dep.clone()]);
        assert_eq!(s.by_uid("U"), Some(&owner));
        s.put(dep.clone(), obj("dep", "D", &[]));
        assert!(s.dependents_of("U").is_empty());
        s.remove(&owner);
        assert!(s.by_uid("U").is_none());
        let changes = s.take_changes();
        assert_eq!(changes.last().unwrap().kind, EventType::Deleted);
        assert!(s.take_changes().is_empty());
    }

    #[test]
    fn a_removal_is_sent_at_its_own_version_without_copying_the_object() {
        let mut s = Store::new(100, 1);
        let key = ObjectKey::new(0, "ns", "o");
        s.put(key.clone(), obj("o", "U", &["P"]));
        let last = s.remove(&key).unwrap();
        assert_eq!(
            last["metadata"]["resourceVersion"], "1",
            "the last stored state"
        );
        let changes = s.take_changes();
        let deleted = changes.last().unwrap();
        assert_eq!((deleted.kind, deleted.rv), (EventType::Deleted, 2));
        assert!(Arc::ptr_eq(&deleted.object, &last), "not copied");

        let sent: Value = serde_json::from_slice(&deleted.object_json(false)).unwrap();
        let mut expected = (*last).clone();
        expected["metadata"]["resourceVersion"] = json!("2");
        assert_eq!(sent, expected, "the whole object, at the removal's version");
        assert_eq!(deleted.sent_object(), expected);
        assert_eq!(*s.removed_at(&last), expected);

        let partial: Value = serde_json::from_slice(&deleted.object_json(true)).unwrap();
        assert_eq!(partial["kind"], "PartialObjectMetadata");
        assert_eq!(partial["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(partial["metadata"], expected["metadata"]);

        // A record that is not a removal is sent as stored.
        let put = &s.history_after(0, 0, 1).unwrap()[0];
        let sent: Value = serde_json::from_slice(&put.object_json(false)).unwrap();
        assert_eq!(sent, put.sent_object());
        assert_eq!(sent["metadata"]["resourceVersion"], "1");
        let partial: Value = serde_json::from_slice(&put.object_json(true)).unwrap();
        assert_eq!(partial["metadata"], sent["metadata"]);
    }

    #[test]
    fn a_metadata_line_is_cut_from_the_whole_line_as_written_from_the_tree() {
        let mut s = Store::new(100, 1);
        let key = ObjectKey::new(0, "ns", "o");
        let mut o = obj("o", "U", &["P"]);
        o["metadata"]["labels"] = json!({"app": "x"});
        o["spec"] = json!({"big": "x".repeat(300)});
        s.put(key.clone(), o.clone());
        o["status"] = json!({"phase": "Running"});
        s.put(key.clone(), o);
        s.remove(&key);
        let records = s.history_after(0, 0, 10).unwrap();
        assert_eq!(records.len(), 3);
        for r in &records {
            let Change::Fresh(record) = r else {
                panic!("fresh")
            };
            let version = record.version();
            let mut partial = Vec::new();
            write_partial_metadata(&mut partial, &record.object, version.as_deref());
            // Asked for the metadata first: the whole line is written, and the metadata cut from it.
            let own = r.object_json(true);
            assert_eq!(
                String::from_utf8(own.to_vec()).unwrap(),
                String::from_utf8(partial).unwrap()
            );
            let whole = record.object_json(false);
            let span = record.meta_span().expect("written, with metadata");
            let sent: Value = serde_json::from_slice(&whole).unwrap();
            let cut: Value = serde_json::from_slice(span.of(&whole)).unwrap();
            assert_eq!(cut, sent["metadata"]);
            assert_eq!(cut["resourceVersion"], r.rv().to_string());
        }
    }

    #[test]
    fn every_watch_shares_one_line_per_record() {
        let mut s = Store::new(100, 1);
        let key = ObjectKey::new(0, "ns", "o");
        s.put(key.clone(), obj("o", "U", &[]));
        s.put(key.clone(), obj("o", "U", &["P"]));
        s.remove(&key);
        let records = s.history_after(0, 0, 10).unwrap();
        let types: Vec<&str> = records.iter().map(|r| r.kind().as_str()).collect();
        assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
        for r in &records {
            for metadata in [false, true] {
                let own = r.event_line(r.kind().as_str(), metadata);
                let again = r.event_line(r.kind().as_str(), metadata);
                assert_eq!(own.as_ptr(), again.as_ptr(), "shared, not copied");
                let line: Value = serde_json::from_slice(&own).unwrap();
                assert!(own.ends_with(b"}\n"), "one line");
                assert_eq!(line["type"], r.kind().as_str());
                let object = r.object_json(metadata);
                assert_eq!(
                    line["object"],
                    serde_json::from_slice::<Value>(&object).unwrap()
                );
                let inside = own.as_ptr_range();
                assert!(
                    inside.contains(&object.as_ptr()),
                    "the object is a slice of the line"
                );
                // Another type (an object that starts or stops matching a selector): same object.
                let other = r.event_line("ERROR", metadata);
                let line2: Value = serde_json::from_slice(&other).unwrap();
                assert_eq!(line2["type"], "ERROR");
                assert_eq!(line2["object"], line["object"]);
            }
            let sent: Value = serde_json::from_slice(&r.object_json(false)).unwrap();
            assert_eq!(sent, r.sent_object());
            assert_eq!(sent["metadata"]["resourceVersion"], r.rv().to_string());
        }
    }

    #[test]
    fn an_ended_object_is_kept_as_text_and_reads_back_the_same() {
        let mut s = Store::new(100, 1);
        s.keep_as_text(
            0,
            KeepRule {
                when: Some(("/status/phase", &["Succeeded", "Failed"])),
                fields: vec!["status.phase", "spec.nodeName"],
            },
        );
        let key = ObjectKey::new(0, "ns", "p");
        let mut pod = obj("p", "U", &["J"]);
        pod["metadata"]["labels"] = json!({"app": "x", "n": "1"});
        pod["spec"] = json!({"nodeName": "node-1", "containers": [{"name": "c", "env": [{"name": "A", "value": "1"}]}]});
        pod["status"] = json!({"phase": "Running"});
        let running = s.put(key.clone(), pod.clone());
        assert!(
            matches!(s.entry(&key), Some(Entry::Tree(_))),
            "a running pod is a tree"
        );
        assert_eq!(s.footprint().kept, 0);
        let tree_bytes_running = s.footprint().object_bytes;

        pod["status"] = json!({"phase": "Succeeded", "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 0}}}]});
        let written = s.put(key.clone(), pod.clone());
        let Some(Entry::Kept(_)) = s.entry(&key) else {
            panic!("a finished pod is kept as text")
        };
        // Read back: the same object, at its version, and what lists filter on answered without it.
        assert_eq!(*s.get(&key).unwrap(), *written);
        assert!(
            Arc::ptr_eq(&s.get(&key).unwrap(), &written),
            "while the written tree is held, a read shares it"
        );
        assert!(!s.entry(&key).unwrap().deleting());
        assert_eq!(s.get(&key).unwrap()["metadata"]["resourceVersion"], "2");
        let entry = s.entry(&key).unwrap();
        assert_eq!(entry.label("app"), Some("x"));
        assert_eq!(entry.label("other"), None);
        assert_eq!(entry.field("status.phase"), "Succeeded");
        assert_eq!(entry.field("spec.nodeName"), "node-1");
        assert_eq!(entry.field("metadata.name"), "p");
        assert_eq!(entry.field("metadata.namespace"), "");
        let listed: Vec<Arc<Value>> = s.list(0, Some("ns"), None).map(Entry::object).collect();
        assert_eq!(listed, vec![written.clone()]);
        // The indices still know it, and a removal sends the whole object.
        assert_eq!(s.by_uid("U"), Some(&key));
        assert_eq!(s.dependents_of("J"), vec![key.clone()]);
        let f = s.footprint();
        assert_eq!((f.objects, f.kept), (1, 1));
        assert!(
            f.object_bytes * 3 < tree_bytes_running,
            "text {} against a tree of {tree_bytes_running}",
            f.object_bytes
        );
        // Once nothing holds the tree (the history compacted the change), a read parses the text,
        // and shares that tree while it is held.
        s.set_compact_after(Duration::ZERO);
        let other = ObjectKey::new(1, "ns", "other");
        s.put(other.clone(), obj("other", "O", &[]));
        s.put(other, obj("other", "O", &["P"]));
        drop((running, listed, s.take_changes()));
        let weak = Arc::downgrade(&written);
        drop(written);
        assert!(weak.upgrade().is_none(), "no tree held");
        let parsed = s.get(&key).unwrap();
        assert_eq!(parsed["status"]["phase"], "Succeeded");
        assert!(Arc::ptr_eq(&s.get(&key).unwrap(), &parsed));
        let last = s.remove(&key).unwrap();
        assert_eq!(*last, *parsed);
        assert!(s.by_uid("U").is_none());

        // A kept object being deleted says so without being parsed.
        let mut gone = obj("g", "G", &[]);
        gone["status"] = json!({"phase": "Failed"});
        gone["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let gkey = ObjectKey::new(0, "ns", "g");
        s.put(gkey.clone(), gone);
        assert!(matches!(s.entry(&gkey), Some(Entry::Kept(_))));
        assert!(s.entry(&gkey).unwrap().deleting());
    }

    #[test]
    fn the_history_keeps_a_window_of_time_and_at_least_its_floor() {
        let mut s = Store::new(100_000, 1);
        s.set_window(Duration::from_millis(200));
        let key = |i: usize| ObjectKey::new(0, "ns", format!("o{i}"));
        s.put(key(0), obj("o0", "U0", &[]));
        std::thread::sleep(Duration::from_millis(300));
        for i in 1..HISTORY_FLOOR {
            s.put(key(i), obj("o", &format!("U{i}"), &[]));
        }
        // The first change is older than the window, but the floor holds it until one more comes.
        assert!(s.history_after(0, 0, 10).is_some());
        s.put(key(HISTORY_FLOOR), obj("o", "last", &[]));
        assert!(
            s.history_after(0, 0, 10).is_none(),
            "the first change left with the window"
        );
        assert!(s.history_after(0, 1, 10).is_some(), "the recent ones stay");
        assert_eq!(s.footprint().history, HISTORY_FLOOR);
    }

    #[test]
    fn uids_look_like_uuids_and_differ() {
        let mut s = Store::new(1, 42);
        let a = s.next_uid();
        let b = s.next_uid();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }
}
