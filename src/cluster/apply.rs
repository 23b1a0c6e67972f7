//! The one place that creates a job's objects in the cluster: in order, idempotently, and all or nothing.
//!
//! A plan is a list of [`Step`]s, each an untyped object plus its [`ApiResource`] and its [`Role`], so
//! this module does not depend on the pipeline's types. [`Applier::apply`]:
//!
//! 1. checks the plan (one primary, companions after it and in its namespace, names present);
//! 2. creates each object with a POST, in order. Namespaces and shared objects are created only when
//!    missing (see [`NamespaceCache`]). Companions get an `ownerReference` to the primary, whose uid is
//!    known once it exists, so the garbage collector removes them with the job;
//! 3. treats `AlreadyExists` by looking at what exists: a primary with the same fingerprint annotation
//!    (the hash of the submission) is this job, applied by an earlier delivery, and is reused; a companion
//!    owned by the primary is reused. Anything else is an [`ApplyError::Conflict`], which the runner turns
//!    into a `duplicate_job_id` FAILURE;
//! 4. when a step fails, deletes everything *this attempt* created, newest first, before returning the
//!    error (W14). Objects found existing are left alone; namespaces and shared objects are never deleted.
//!
//! [`Applier::apply_telling`] also says the moment the primary exists, so that what must follow its
//! create (the submit path's read of a cancel's tombstone) goes alongside the companions' creates.
//!
//! Transient errors are retried within one [`RetryPolicy`] budget for the whole plan. Rollback is best
//! effort: if it cannot delete something (the API server is down), the leftover carries the same
//! fingerprint or ownerReference, so the next attempt adopts it instead of tripping over it.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::core::{ApiResource, Resource, TypeMeta};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::{ClusterError, ErrorClass, KubeResultExt};
use super::labels::{FIELD_MANAGER, ROLLED_BACK, is_rolled_back};
use super::namespaces::NamespaceCache;
use super::object_key::ObjectKey;
use super::retry::{Budget, RetryPolicy};

/// What an object is to the job, which decides how it is created and whether a rollback removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An object shared by many jobs: the owner's namespace, its baseline NetworkPolicies, a project's
    /// Volcano queue. Created when missing, any existing one is accepted as it is, cached, never rolled
    /// back. May be cluster-scoped.
    Shared,
    /// The VolcanoJob. Exactly one per plan; it carries the fingerprint annotation.
    Primary,
    /// An object that belongs to the job (Service, ConfigMap, NetworkPolicy): created after the primary
    /// with an ownerReference to it, rolled back with it.
    Companion,
}

/// One object of a plan.
///
/// Held as the applier uses it, not as a JSON tree: the metadata typed (the applier reads its name,
/// namespace and fingerprint, and adds a companion's owner), every other field serialised once. A
/// submission holds its plan for the whole apply, and as `serde_json::Value` trees (a map node of about
/// 640 bytes per JSON object, however few its fields) a figlet job's plan took about 68 KiB per
/// submission in hand, and each companion was cloned once more to add its owner reference; held so, about
/// 8 KiB, the size of the request bodies (`tests/cluster/rendered.rs`; README, *Performance*).
#[derive(Debug, Clone)]
pub struct Step {
    /// Group, version, kind and plural (the URL path) of the object.
    pub resource: ApiResource,
    /// `apiVersion` and `kind` as the object says them.
    pub types: TypeMeta,
    /// The object's metadata as it should be created.
    pub metadata: ObjectMeta,
    /// Every other field of the object, as the text of one JSON object (`{"spec":…}`).
    fields: Box<str>,
    /// Where in `fields` the metadata goes when the object is sent: where the object's serialisation
    /// writes it, just after the field written before it (1: first, after the brace). k8s-openapi writes
    /// the fields of most types in alphabetical order, `metadata` among them (a ConfigMap's after its
    /// `data`); a [`DynamicObject`] writes it first.
    metadata_at: usize,
    /// How to create it.
    pub role: Role,
}

impl Step {
    /// A step from JSON with `apiVersion`, `kind` and `metadata`. The plural is derived from the kind
    /// (`Job` → `jobs`, `NetworkPolicy` → `networkpolicies`). Made as [`Step::from_typed`] makes one, of
    /// the JSON taken as a [`DynamicObject`] (the metadata first, then the other fields in the order
    /// the JSON object keeps them).
    pub fn from_value(value: serde_json::Value, role: Role) -> Result<Self, PlanError> {
        let mut object = dynamic_object(value)?;
        let types = object
            .types
            .clone()
            .ok_or_else(|| PlanError("an object has no apiVersion/kind".into()))?;
        let (group, version) = match types.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", types.api_version.as_str()),
        };
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        // The metadata is held typed, not written: it is moved out, not cloned.
        let metadata = std::mem::take(&mut object.metadata);
        Self::written(ApiResource::from_gvk(&gvk), types, metadata, &object, role)
    }

    /// A step from a typed object (k8s-openapi types, or the Volcano mirror types): the submit path's
    /// every object. Its metadata is cloned as it is, and its other top-level fields are written straight
    /// to the text the step holds, in the order and form the type writes them, noting where its metadata
    /// was: no `serde_json::Value` tree is built on the way (one per object, each JSON object of it a map
    /// node). What the step sends is what `serde_json::to_string` of the object gives. `apiVersion` and
    /// `kind` are the type's own, which is what its serialisation says.
    pub fn from_typed<K>(object: &K, role: Role) -> Result<Self, PlanError>
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let resource = ApiResource::erase::<K>(&());
        let types = TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        };
        Self::written(resource, types, object.meta().clone(), object, role)
    }

    /// The one way a step is made: `object`'s top-level fields but its types and metadata, written as
    /// its serialisation writes them, with where its metadata came (see [`Step::metadata_at`]), so that
    /// what is sent is the object as serde_json writes it.
    fn written(
        resource: ApiResource,
        types: TypeMeta,
        metadata: ObjectMeta,
        object: &impl Serialize,
        role: Role,
    ) -> Result<Self, PlanError> {
        let (fields, metadata_at) = top_level_fields(object)
            .map_err(|e| PlanError(format!("{} does not serialise: {e}", resource.kind)))?;
        Ok(Self {
            resource,
            types,
            metadata,
            fields: fields.into_boxed_str(),
            metadata_at,
            role,
        })
    }

    /// Which object this step is about.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of_meta(&self.resource, &self.metadata)
    }

    /// The object as a tree again: for the rare reader of its fields (a shared object not known to
    /// exist yet, tests), not for the create, which sends [`Step::body`].
    pub fn object(&self) -> Result<DynamicObject, PlanError> {
        let data = serde_json::from_str(&self.fields)
            .map_err(|e| PlanError(format!("{}: {e}", self.key())))?;
        Ok(DynamicObject {
            types: Some(self.types.clone()),
            metadata: self.metadata.clone(),
            data,
        })
    }

    /// The request body that creates the object: its JSON, with `owner` among its ownerReferences
    /// (replacing a reference to the same kind and name: a placeholder without the real uid, or a stale
    /// one). Built for each request, so that nothing but the step is held while the answer is awaited.
    pub fn body(&self, owner: Option<&OwnerReference>) -> Result<Vec<u8>, serde_json::Error> {
        let owned;
        let metadata = match owner {
            Some(owner) => {
                owned = with_owner(&self.metadata, owner);
                &owned
            }
            None => &self.metadata,
        };
        let mut body = Vec::with_capacity(self.fields.len() + 512);
        body.extend_from_slice(b"{\"apiVersion\":");
        serde_json::to_writer(&mut body, &self.types.api_version)?;
        body.extend_from_slice(b",\"kind\":");
        serde_json::to_writer(&mut body, &self.types.kind)?;
        // `fields` is `{}` or `{"a":…,"b":…}`, and the metadata goes between two of its members (or
        // before the first, or after the last): the members before it, the metadata, the members after
        // it (which start with their comma), the closing brace.
        let members = self
            .fields
            .strip_prefix('{')
            .and_then(|f| f.strip_suffix('}'))
            .unwrap_or_default();
        let (before, after) =
            members.split_at(self.metadata_at.saturating_sub(1).min(members.len()));
        if !before.is_empty() {
            body.push(b',');
            body.extend_from_slice(before.as_bytes());
        }
        body.extend_from_slice(b",\"metadata\":");
        serde_json::to_writer(&mut body, metadata)?;
        if before.is_empty() && !after.is_empty() {
            body.push(b',');
        }
        body.extend_from_slice(after.as_bytes());
        body.push(b'}');
        Ok(body)
    }

    /// The bytes this step holds on the heap (its metadata estimated, the rest exact): what a
    /// submission in hand pays for its plan.
    pub fn heap_bytes(&self) -> usize {
        let strings = |m: &Option<std::collections::BTreeMap<String, String>>| {
            m.iter()
                .flatten()
                .map(|(k, v)| k.capacity() + v.capacity() + 64)
                .sum::<usize>()
        };
        let meta = &self.metadata;
        self.fields.len()
            + self.types.api_version.capacity()
            + self.types.kind.capacity()
            + meta.name.as_ref().map_or(0, String::capacity)
            + meta.namespace.as_ref().map_or(0, String::capacity)
            + strings(&meta.labels)
            + strings(&meta.annotations)
            + meta
                .finalizers
                .iter()
                .flatten()
                .map(|f| f.capacity() + 24)
                .sum::<usize>()
            + meta
                .owner_references
                .iter()
                .flatten()
                .map(|r| r.api_version.len() + r.kind.len() + r.name.len() + r.uid.len() + 128)
                .sum::<usize>()
    }
}

/// A JSON object as a [`DynamicObject`]: `apiVersion` and `kind` as its types, `metadata` decoded, every
/// other field moved as it is. Not `serde_json::from_value`: the flattened `data` makes serde buffer the
/// whole object (a VolcanoJob's every template) once more before building it again.
fn dynamic_object(value: serde_json::Value) -> Result<DynamicObject, PlanError> {
    let serde_json::Value::Object(mut fields) = value else {
        return Err(PlanError(
            "not a Kubernetes object: it is not a JSON object".into(),
        ));
    };
    let mut text = |field: &str| match fields.remove(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(PlanError(format!(
            "not a Kubernetes object: `{field}` is {other}, not a string"
        ))),
    };
    let types = match (text("apiVersion")?, text("kind")?) {
        (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
        _ => None,
    };
    let metadata = match fields.remove("metadata") {
        None => {
            return Err(PlanError(
                "not a Kubernetes object: it has no metadata".into(),
            ));
        }
        Some(m) => serde_json::from_value(m)
            .map_err(|e| PlanError(format!("not a Kubernetes object: metadata: {e}")))?,
    };
    Ok(DynamicObject {
        types,
        metadata,
        data: serde_json::Value::Object(fields),
    })
}

/// The top-level fields a [`Step`] keeps as text: all but `apiVersion`, `kind` and `metadata`, which it
/// holds typed.
const TYPED_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// `object`'s top-level fields but [`TYPED_FIELDS`], as the text of one JSON object written as serde_json
/// writes them in the object's own text, and where in it the metadata was (see [`Step::metadata_at`]).
fn top_level_fields<K: Serialize>(object: &K) -> Result<(String, usize), serde_json::Error> {
    let mut out = Vec::with_capacity(1024);
    let written = std::cell::Cell::new(0);
    let metadata_at = std::cell::Cell::new(1);
    object.serialize(&mut TopLevelFields {
        json: serde_json::Serializer::new(Tally {
            out: &mut out,
            written: &written,
        }),
        written: &written,
        metadata_at: &metadata_at,
    })?;
    // serde_json writes UTF-8 only: this checks what is in cache already.
    let text = String::from_utf8(out).map_err(|e| {
        <serde_json::Error as serde::ser::Error>::custom(format_args!("not UTF-8: {e}"))
    })?;
    Ok((text, metadata_at.get()))
}

/// The text being written, and how long it is so far (read while serde_json holds the writer).
struct Tally<'a> {
    out: &'a mut Vec<u8>,
    written: &'a std::cell::Cell<usize>,
}

impl std::io::Write for Tally<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(buf);
        self.written.set(self.out.len());
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.write(buf).map(drop)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A serializer for a Kubernetes object that writes its top-level fields but [`TYPED_FIELDS`] as one
/// JSON object, and notes where `metadata` came. Anything but a struct or a map at the top is refused:
/// that is not a Kubernetes object.
struct TopLevelFields<'a> {
    json: serde_json::Serializer<Tally<'a>>,
    written: &'a std::cell::Cell<usize>,
    metadata_at: &'a std::cell::Cell<usize>,
}

/// The fields of the object being written, after its opening brace.
struct FieldsOf<'s, 'a> {
    json: serde_json::ser::Compound<'s, Tally<'a>, serde_json::ser::CompactFormatter>,
    written: &'a std::cell::Cell<usize>,
    metadata_at: &'a std::cell::Cell<usize>,
    /// A map's key was one of [`TYPED_FIELDS`]: its value is left out too.
    skip_value: bool,
}

impl<'s, 'a> FieldsOf<'s, 'a> {
    fn open(top: &'s mut TopLevelFields<'a>) -> Result<Self, serde_json::Error> {
        use serde::Serializer as _;
        // No length: some fields are left out, and serde_json writes `{}` at once for a length of 0.
        Ok(Self {
            json: (&mut top.json).serialize_map(None)?,
            written: top.written,
            metadata_at: top.metadata_at,
            skip_value: false,
        })
    }

    /// Whether the field `key` is left out; notes where the metadata was.
    fn typed(&self, key: &str) -> bool {
        if key == "metadata" {
            // After the brace or after the last member written; a comma comes before the next.
            self.metadata_at.set(self.written.get());
        }
        TYPED_FIELDS.contains(&key)
    }
}

fn not_an_object(what: &str) -> serde_json::Error {
    serde::ser::Error::custom(format_args!(
        "not a Kubernetes object: it serialises as {what}, not as a JSON object"
    ))
}

/// Refuses a top-level value that is not an object, naming what it is.
macro_rules! refuse {
    ($($method:ident($($arg:ty),*) $what:literal;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Self::Ok, Self::Error> {
            Err(not_an_object($what))
        })*
    };
}

impl<'s, 'a> serde::Serializer for &'s mut TopLevelFields<'a> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = serde::ser::Impossible<(), serde_json::Error>;
    type SerializeTuple = serde::ser::Impossible<(), serde_json::Error>;
    type SerializeTupleStruct = serde::ser::Impossible<(), serde_json::Error>;
    type SerializeTupleVariant = serde::ser::Impossible<(), serde_json::Error>;
    type SerializeMap = FieldsOf<'s, 'a>;
    type SerializeStruct = FieldsOf<'s, 'a>;
    type SerializeStructVariant = serde::ser::Impossible<(), serde_json::Error>;

    refuse! {
        serialize_bool(bool) "a boolean";
        serialize_i8(i8) "a number";
        serialize_i16(i16) "a number";
        serialize_i32(i32) "a number";
        serialize_i64(i64) "a number";
        serialize_u8(u8) "a number";
        serialize_u16(u16) "a number";
        serialize_u32(u32) "a number";
        serialize_u64(u64) "a number";
        serialize_f32(f32) "a number";
        serialize_f64(f64) "a number";
        serialize_char(char) "a string";
        serialize_str(&str) "a string";
        serialize_bytes(&[u8]) "an array";
        serialize_none() "null";
        serialize_unit() "null";
        serialize_unit_struct(&'static str) "null";
        serialize_unit_variant(&'static str, u32, &'static str) "a string";
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Self::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Self::Error> {
        Err(not_an_object("an enum variant"))
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Self::Error> {
        Err(not_an_object("an array"))
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Self::Error> {
        Err(not_an_object("an array"))
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Self::Error> {
        Err(not_an_object("an array"))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Self::Error> {
        Err(not_an_object("an enum variant"))
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Self::Error> {
        FieldsOf::open(self)
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, Self::Error> {
        FieldsOf::open(self)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Self::Error> {
        Err(not_an_object("an enum variant"))
    }
}

impl serde::ser::SerializeStruct for FieldsOf<'_, '_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        if self.typed(key) {
            return Ok(());
        }
        serde::ser::SerializeMap::serialize_entry(&mut self.json, key, value)
    }

    fn end(self) -> Result<(), Self::Error> {
        serde::ser::SerializeMap::end(self.json)
    }
}

impl serde::ser::SerializeMap for FieldsOf<'_, '_> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Self::Error> {
        // A top-level map (a type with a flattened field): its keys are strings, rarely more than a few.
        let text = serde_json::to_value(key)?;
        self.skip_value = text.as_str().is_some_and(|k| self.typed(k));
        if self.skip_value {
            return Ok(());
        }
        serde::ser::SerializeMap::serialize_key(&mut self.json, key)
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Self::Error> {
        if std::mem::take(&mut self.skip_value) {
            return Ok(());
        }
        serde::ser::SerializeMap::serialize_value(&mut self.json, value)
    }

    fn end(self) -> Result<(), Self::Error> {
        serde::ser::SerializeMap::end(self.json)
    }
}

/// What a successful apply did.
#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    /// The primary's metadata as the cluster has it (with its uid and resourceVersion). Only the
    /// metadata: what follows an apply reads no more, and the API's answer is not decoded further.
    pub primary: ObjectMeta,
    /// The primary existed already with the same fingerprint: an earlier delivery applied this job.
    pub primary_existed: bool,
    /// The primary exists with the same fingerprint and is being deleted: the job has ended (or is
    /// ending), and the object is kept as the record of this submission. Nothing was created.
    pub primary_ended: bool,
    /// Objects this attempt created, in order.
    pub created: Vec<ObjectKey>,
    /// Job objects (primary and companions) that existed already and were adopted.
    pub reused: Vec<ObjectKey>,
}

/// What an attempt has done so far, step by step: the objects it created (owned by the caller, which
/// rolls them back when a later step fails) and those it found there already.
struct Progress<'a> {
    created: &'a mut Vec<Created>,
    reused: Vec<ObjectKey>,
}

impl Progress<'_> {
    /// Notes the step's object as reused (`existed`: an earlier delivery's) or as created by this
    /// attempt (what a rollback deletes). `uid` is the created object's; `had`, of a primary only, the
    /// finalizers it was created with (what its rollback releases: [`Release`]).
    fn note(
        &mut self,
        step: &Step,
        key: ObjectKey,
        uid: Option<String>,
        had: Option<Vec<String>>,
        existed: bool,
    ) {
        if existed {
            self.reused.push(key);
        } else {
            self.created.push(Created {
                key,
                resource: step.resource.clone(),
                uid,
                release: had.map(|had| Release {
                    ours: step.metadata.finalizers.clone().unwrap_or_default(),
                    had,
                }),
            });
        }
    }
}

/// What a create asks the API server to answer with: the created object's `PartialObjectMetadata`, or,
/// from a server that cannot, the object itself (the decoder reads the metadata of either). The answer
/// is all the applier reads of a create, and a VolcanoJob's whole answer (every template with its output
/// wrapper) was most of the bytes a submission's requests brought back.
pub const CREATE_ACCEPT: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json";

/// A JSON patch (`ops`, RFC 6902) of the object at `url`, sent as a raw request: kube's `Patch::Json`
/// needs its `jsonpatch` feature for the two writes that use one (a rollback's release, the monitor's
/// guarded annotation writes). A failed `test` comes back as 422.
pub fn json_patch_request(
    url: &str,
    ops: &serde_json::Value,
) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let body = serde_json::to_vec(ops).map_err(kube::Error::SerdeError)?;
    http::Request::patch(url)
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(body)
        .map_err(kube::Error::HttpError)
}

/// The POST that creates `body` in the collection at `url`, asking for the metadata alone back
/// ([`CREATE_ACCEPT`]).
fn create_request(
    url: &str,
    params: &PostParams,
    body: Vec<u8>,
) -> Result<http::Request<Vec<u8>>, kube::Error> {
    let mut request = kube::core::Request::new(url)
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(CREATE_ACCEPT),
    );
    Ok(request)
}

/// The part of a write's answer the applier reads: the object's metadata. Every other field of the
/// answer is skipped by the decoder, not built.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// What a rollback did after a failed step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rollback {
    /// Objects created by the failed attempt and deleted again, newest first.
    pub deleted: Vec<ObjectKey>,
    /// Objects the rollback could not delete, with why. The next attempt adopts them.
    pub failed: Vec<(ObjectKey, ClusterError)>,
}

impl fmt::Display for Rollback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.deleted.is_empty() {
            write!(f, "; removed again: ")?;
            write_keys(f, self.deleted.iter())?;
        }
        if !self.failed.is_empty() {
            write!(f, "; could not remove: ")?;
            write_keys(f, self.failed.iter().map(|(k, _)| k))?;
        }
        Ok(())
    }
}

fn write_keys<'a>(
    f: &mut fmt::Formatter<'_>,
    keys: impl Iterator<Item = &'a ObjectKey>,
) -> fmt::Result {
    for (i, key) in keys.enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{key}")?;
    }
    Ok(())
}

/// Why a plan is inconsistent (a bug in whoever built it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

/// Why a plan was not applied. Anything this attempt created has been removed (see `rollback`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApplyError {
    /// The plan itself is wrong (a bug in whoever built it): retrying cannot help.
    #[error("the objects to apply are inconsistent: {0}")]
    InvalidPlan(#[from] PlanError),
    /// An object of the job's name exists and is not this job's: another submission with the same job id
    /// (`role` = Primary, fingerprint differs), or a companion's name taken by something else.
    #[error(
        "{object} exists already and belongs to something else (its fingerprint: {}; ours: {desired}){rollback}",
        existing.as_deref().unwrap_or("none")
    )]
    Conflict {
        object: ObjectKey,
        role: Role,
        existing: Option<String>,
        desired: String,
        rollback: Rollback,
    },
    /// The cluster refused a step or could not be reached; `source.class()` says whether to requeue.
    #[error("{source}{rollback}")]
    Cluster {
        object: ObjectKey,
        source: ClusterError,
        rollback: Rollback,
    },
}

impl ApplyError {
    /// Retryable for transient cluster errors; permanent for conflicts, rejections and bad plans.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Cluster { source, .. } => source.class(),
            Self::InvalidPlan(_) | Self::Conflict { .. } => ErrorClass::Permanent,
        }
    }

    /// Shorthand for `class() == Retryable`.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retryable
    }

    /// Whether the job id is taken by a different submission (the runner's `duplicate_job_id`).
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    /// What the rollback did (empty for an invalid plan).
    pub fn rollback(&self) -> Option<&Rollback> {
        match self {
            Self::Conflict { rollback, .. } | Self::Cluster { rollback, .. } => Some(rollback),
            Self::InvalidPlan(_) => None,
        }
    }
}

/// Creates plans in the cluster. Cheap to share between handlers (`Arc`).
pub struct Applier {
    client: kube::Client,
    retry: RetryPolicy,
    namespaces: NamespaceCache,
    fingerprint_annotation: String,
    /// An annotation whose presence on the primary says the job has ended (the pipeline's
    /// `<prefix>outcome`, written before its end is acted on): see [`Applier::with_end_marker`].
    end_marker: Option<String>,
}

/// Why one step stopped the plan, before rollback.
enum StepError {
    Cluster(ObjectKey, ClusterError),
    Conflict {
        object: ObjectKey,
        role: Role,
        existing: Option<String>,
        desired: String,
    },
}

impl StepError {
    fn cluster(key: &ObjectKey, e: ClusterError) -> Self {
        Self::Cluster(key.clone(), e)
    }
}

/// An object this attempt created: enough to delete exactly that object again.
struct Created {
    key: ObjectKey,
    resource: ApiResource,
    uid: Option<String>,
    /// Of a primary: what its rollback writes before the delete (see [`release`]).
    release: Option<Release>,
}

/// The finalizers of a primary this attempt created: those the attempt put on it (the cleanup
/// finalizer), which a rollback takes off, and all it had as created, which the rollback's write tests.
struct Release {
    ours: Vec<String>,
    had: Vec<String>,
}

impl fmt::Debug for Applier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Applier")
            .field("retry", &self.retry)
            .field("fingerprint_annotation", &self.fingerprint_annotation)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// An applier. `fingerprint_annotation` is the annotation key on the primary that identifies the
    /// submission (the pipeline's `<prefix>submissionHash`).
    pub fn new(
        client: kube::Client,
        retry: RetryPolicy,
        fingerprint_annotation: impl Into<String>,
    ) -> Self {
        Self {
            client,
            retry,
            namespaces: NamespaceCache::new(),
            fingerprint_annotation: fingerprint_annotation.into(),
            end_marker: None,
        }
    }

    /// Takes a primary carrying annotation `key` for ended, whatever Volcano's phase says yet: the end is
    /// recorded there before the job is terminated and its companions deleted, and a companion created
    /// after that deletion would stay, owned by the kept job, for its whole retention.
    pub fn with_end_marker(mut self, key: impl Into<String>) -> Self {
        self.end_marker = Some(key.into());
        self
    }

    /// The namespaces this applier knows to exist.
    pub fn namespaces(&self) -> &NamespaceCache {
        &self.namespaces
    }

    /// Applies `plan` in order. See the module documentation.
    pub async fn apply(&self, plan: &[Step]) -> Result<ApplyOutcome, ApplyError> {
        self.apply_telling(plan, None).await
    }

    /// Applies `plan` in order, and tells `primary_in` the moment the primary exists in the cluster and
    /// has not ended, before its companions are created. What has to follow the primary's create, and
    /// not theirs, can then go alongside them instead of after them: the submit path's read of a
    /// cancel's tombstone, one round trip fewer per submission. Dropped without a word when the primary
    /// was not created or had ended.
    pub async fn apply_telling(
        &self,
        plan: &[Step],
        primary_in: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<ApplyOutcome, ApplyError> {
        let desired = check_plan(plan, &self.fingerprint_annotation)?;
        let budget = self.retry.budget();
        let mut created = Vec::new();
        match self
            .apply_steps(plan, &desired, &budget, &mut created, primary_in)
            .await
        {
            Ok(outcome) => Ok(outcome),
            Err(failure) => {
                let rollback = self.rollback(created).await;
                Err(match failure {
                    StepError::Cluster(object, source) => ApplyError::Cluster {
                        object,
                        source,
                        rollback,
                    },
                    StepError::Conflict {
                        object,
                        role,
                        existing,
                        desired,
                    } => ApplyError::Conflict {
                        object,
                        role,
                        existing,
                        desired,
                        rollback,
                    },
                })
            }
        }
    }

    async fn apply_steps(
        &self,
        plan: &[Step],
        fingerprint: &str,
        budget: &Budget<'_>,
        created: &mut Vec<Created>,
        mut primary_in: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<ApplyOutcome, StepError> {
        let mut primary: Option<(ObjectMeta, OwnerReference)> = None;
        let mut primary_step: Option<&Step> = None;
        let mut primary_existed = false;
        let mut progress = Progress {
            created,
            reused: Vec::new(),
        };
        for step in plan {
            let key = step.key();
            match step.role {
                Role::Shared => self.ensure_shared(step, &key, budget).await?,
                Role::Primary => {
                    let (object, existed, ended) =
                        self.create_primary(step, &key, fingerprint, budget).await?;
                    if existed && ended {
                        // This submission's job, ended (terminated or finished, kept until its TTL, or
                        // deleted by an older runner): nothing more to create, and its companions, deleted
                        // at its end, must not come back. One that did (an earlier attempt's create that
                        // landed after the end) goes now.
                        self.sweep_companions(plan, &object, budget).await;
                        return Ok(ApplyOutcome {
                            primary: object,
                            primary_existed: true,
                            primary_ended: true,
                            created: progress.created.iter().map(|c| c.key.clone()).collect(),
                            reused: vec![key],
                        });
                    }
                    primary_existed = existed;
                    progress.note(
                        step,
                        key,
                        object.uid.clone(),
                        Some(object.finalizers.clone().unwrap_or_default()),
                        existed,
                    );
                    let owner = owner_reference(&step.resource, &object).ok_or_else(|| {
                        StepError::cluster(
                            &step.key(),
                            ClusterError::Internal {
                                op: format!("create {}", step.key()),
                                message: "the cluster returned the object without a uid".into(),
                            },
                        )
                    })?;
                    primary = Some((object, owner));
                    primary_step = Some(step);
                    if let Some(tell) = primary_in.take() {
                        // Nobody listening is fine: the caller reads after the apply instead.
                        let _ = tell.send(());
                    }
                }
                Role::Companion => {
                    // check_plan guarantees the primary came first.
                    let Some((_, owner)) = &primary else {
                        unreachable!("check_plan puts the primary before its companions")
                    };
                    let (uid, existed) = self.create_companion(step, &key, owner, budget).await?;
                    progress.note(step, key, uid, None, existed);
                }
            }
        }
        let (primary, _) = primary.unwrap_or_else(|| unreachable!("check_plan requires a primary"));
        let Progress { created, reused } = progress;
        if primary_existed
            && !created.is_empty()
            && let Some(step) = primary_step
            && self.ended_meanwhile(step, budget).await?
        {
            // An earlier delivery's job, which ended (and had its companions deleted) while this attempt
            // created some again: they go, so that an ended job never regains a companion.
            let undone = std::mem::take(created);
            let rollback = self.rollback(undone).await;
            if let Some((key, e)) = rollback.failed.into_iter().next() {
                return Err(StepError::Cluster(key, e));
            }
            return Ok(ApplyOutcome {
                primary,
                primary_existed: true,
                primary_ended: true,
                created: Vec::new(),
                reused,
            });
        }
        Ok(ApplyOutcome {
            primary,
            primary_existed,
            primary_ended: false,
            created: created.iter().map(|c| c.key.clone()).collect(),
            reused,
        })
    }

    /// Makes sure a shared object (the owner's namespace) exists. Known to exist (the usual case), its
    /// fields are not read back into a tree.
    async fn ensure_shared(
        &self,
        step: &Step,
        key: &ObjectKey,
        budget: &Budget<'_>,
    ) -> Result<(), StepError> {
        let object = || {
            step.object().map_err(|e| ClusterError::Internal {
                op: format!("create {key}"),
                message: e.0,
            })
        };
        self.namespaces
            .ensure(&self.client, budget, &step.resource, key, object)
            .await
            .map(drop)
            .map_err(|e| StepError::cluster(key, e))
    }

    /// Creates the primary, or finds it applied by an earlier delivery. Returns the object and whether it
    /// existed.
    async fn create_primary(
        &self,
        step: &Step,
        key: &ObjectKey,
        fingerprint: &str,
        budget: &Budget<'_>,
    ) -> Result<(ObjectMeta, bool, bool), StepError> {
        match self.create(step, key, None, budget).await {
            Ok(object) => return Ok((object, false, false)),
            Err(e) if !e.is_already_exists() => return Err(StepError::cluster(key, e)),
            Err(_) => {}
        }
        let found = self.get_existing(step, key, budget, true).await?;
        if is_rolled_back(&found.metadata) {
            // An earlier attempt's, undone: what is left of it goes (its delete may have failed), and
            // the submission is tried again once it has.
            let leftover = Created {
                key: key.clone(),
                resource: step.resource.clone(),
                uid: found.metadata.uid.clone(),
                release: None,
            };
            delete_created(&self.client, budget, &leftover)
                .await
                .map_err(|e| StepError::cluster(key, e))?;
            return Err(StepError::cluster(
                key,
                ClusterError::Conflict {
                    op: format!("create {key}"),
                    message: "an earlier attempt's job, rolled back, is still being removed".into(),
                },
            ));
        }
        let ended = has_ended(&found, self.end_marker.as_deref());
        let existing = found.metadata;
        let theirs = annotation(&existing, &self.fingerprint_annotation);
        if theirs != Some(fingerprint) {
            return Err(StepError::Conflict {
                object: key.clone(),
                role: Role::Primary,
                existing: theirs.map(str::to_owned),
                desired: fingerprint.to_owned(),
            });
        }
        Ok((existing, true, ended))
    }

    /// Creates a companion, or finds it created for this primary by an earlier delivery. Returns its uid
    /// and whether it existed.
    async fn create_companion(
        &self,
        step: &Step,
        key: &ObjectKey,
        owner: &OwnerReference,
        budget: &Budget<'_>,
    ) -> Result<(Option<String>, bool), StepError> {
        match self.create(step, key, Some(owner), budget).await {
            Ok(made) => return Ok((made.uid, false)),
            Err(e) if !e.is_already_exists() => return Err(StepError::cluster(key, e)),
            Err(_) => {}
        }
        let existing = self.get_existing(step, key, budget, false).await?;
        let refs = existing
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default();
        if refs.iter().any(|r| r.uid == owner.uid) {
            return Ok((existing.metadata.uid, true));
        }
        if refs
            .iter()
            .any(|r| r.kind == owner.kind && r.name == owner.name)
        {
            // Left over from an earlier object of the same name that has been deleted: the garbage
            // collector removes it shortly.
            return Err(StepError::cluster(
                key,
                ClusterError::Conflict {
                    op: format!("create {key}"),
                    message: format!(
                        "it still belongs to an earlier {} {}; waiting for the garbage collector",
                        owner.kind, owner.name
                    ),
                },
            ));
        }
        Err(StepError::Conflict {
            object: key.clone(),
            role: Role::Companion,
            existing: annotation(&existing.metadata, &self.fingerprint_annotation)
                .map(str::to_owned),
            desired: format!("owned by {} {}", owner.kind, owner.name),
        })
    }

    /// Creates `step`'s object (a companion with `owner` among its ownerReferences) and returns the
    /// metadata of the answer.
    async fn create(
        &self,
        step: &Step,
        key: &ObjectKey,
        owner: Option<&OwnerReference>,
        budget: &Budget<'_>,
    ) -> Result<ObjectMeta, ClusterError> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let op = format!("create {key}");
        let url = self.api(step, key).resource_url().to_owned();
        let result = budget
            .run(&op, || async {
                // Written for each attempt rather than kept beside the step: the request owns it.
                let body = step.body(owner).map_err(|e| ClusterError::Internal {
                    op: op.clone(),
                    message: format!("the object does not serialise: {e}"),
                })?;
                let request = create_request(&url, &params, body).classify(|| op.clone())?;
                // Not `Api::create`: that decodes the whole answer (a VolcanoJob's every template) into a
                // `DynamicObject` through serde's buffering, and only the metadata is read.
                self.client
                    .request::<Answer>(request)
                    .await
                    .map(|a| a.metadata)
                    .classify(|| op.clone())
            })
            .await;
        match result {
            Err(ClusterError::NotFound { message, .. }) => {
                // The namespace is gone (or the resource type is not served). Not the job's fault: forget
                // the namespace so the next attempt creates it, and let the message be requeued.
                if let Some(ns) = &key.namespace {
                    self.namespaces.forget_namespace(ns);
                }
                Err(ClusterError::Unavailable {
                    op,
                    message: format!("{message} (the namespace or the resource type is missing)"),
                    retry_after: None,
                })
            }
            other => other,
        }
    }

    /// Reads the object that answered AlreadyExists. If it vanished meanwhile, or is on its way out
    /// (deletionTimestamp set) and `deleting_is_final` is false, that is a transient conflict: the next
    /// attempt sees the final state. A primary being deleted is final: it is kept, as the record of its
    /// submission, for `ended_job_retention`.
    async fn get_existing(
        &self,
        step: &Step,
        key: &ObjectKey,
        budget: &Budget<'_>,
        deleting_is_final: bool,
    ) -> Result<DynamicObject, StepError> {
        let api = self.api(step, key);
        let op = format!("get {key}");
        let found = budget
            .run(&op, || async {
                api.get_opt(&key.name).await.classify(|| op.clone())
            })
            .await
            .map_err(|e| StepError::cluster(key, e))?;
        let transient = |message: &str| {
            StepError::cluster(
                key,
                ClusterError::Conflict {
                    op: format!("create {key}"),
                    message: message.to_owned(),
                },
            )
        };
        match found {
            None => Err(transient("it existed a moment ago and is gone now")),
            Some(existing)
                if existing.metadata.deletion_timestamp.is_some() && !deleting_is_final =>
            {
                Err(transient(
                    "an earlier object of this name is still being deleted",
                ))
            }
            Some(existing) => Ok(existing),
        }
    }

    /// Whether the primary, adopted from an earlier delivery, has ended since it was read (one read,
    /// after this attempt's companion creates: an end recorded before a create has landed by then).
    async fn ended_meanwhile(&self, step: &Step, budget: &Budget<'_>) -> Result<bool, StepError> {
        let key = step.key();
        match self.get_existing(step, &key, budget, true).await {
            Ok(found) => Ok(has_ended(&found, self.end_marker.as_deref())),
            // Gone: deleted, its companions with it (the garbage collector follows their references).
            Err(StepError::Cluster(_, e)) if e.is_conflict() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Deletes the plan's companions found owned by the ended primary `owner` (best effort: a leftover
    /// that stays is deleted by the next delivery, or with the job at its TTL).
    async fn sweep_companions(&self, plan: &[Step], owner: &ObjectMeta, budget: &Budget<'_>) {
        let Some(uid) = owner.uid.as_deref() else {
            return;
        };
        for step in plan.iter().filter(|s| s.role == Role::Companion) {
            let key = step.key();
            let api = self.api(step, &key);
            let op = format!("get {key}");
            let found = budget
                .run(&op, || async {
                    api.get_opt(&key.name).await.classify(|| op.clone())
                })
                .await;
            let Ok(Some(found)) = found else { continue };
            let owned = found
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|r| r.uid == uid);
            if !owned || found.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let item = Created {
                key: key.clone(),
                resource: step.resource.clone(),
                uid: found.metadata.uid.clone(),
                release: None,
            };
            match delete_created(&self.client, budget, &item).await {
                Ok(()) => {
                    tracing::info!(object = %key, "Deleted a companion of an ended job, created after its end.")
                }
                Err(e) => {
                    tracing::warn!(object = %key, error = %e, "Could not delete a companion of an ended job.")
                }
            }
        }
    }

    /// Deletes what this attempt created, newest first. Each delete is conditional on the uid we
    /// created, so an object someone else has made since is never touched.
    async fn rollback(&self, created: Vec<Created>) -> Rollback {
        let mut rollback = Rollback::default();
        if created.is_empty() {
            return rollback;
        }
        let budget = self.retry.budget();
        for item in created.into_iter().rev() {
            match delete_created(&self.client, &budget, &item).await {
                Ok(()) => rollback.deleted.push(item.key),
                Err(e) => {
                    tracing::warn!(object = %item.key, error = %e, "Rollback could not delete an object.");
                    rollback.failed.push((item.key, e));
                }
            }
        }
        rollback
    }

    fn api(&self, step: &Step, key: &ObjectKey) -> Api<DynamicObject> {
        match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &step.resource),
            None => Api::all_with(self.client.clone(), &step.resource),
        }
    }
}

async fn delete_created(
    client: &kube::Client,
    budget: &Budget<'_>,
    item: &Created,
) -> Result<(), ClusterError> {
    let key = &item.key;
    let api: Api<DynamicObject> = match &key.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &item.resource),
        None => Api::all_with(client.clone(), &item.resource),
    };
    if let Some(written) = &item.release {
        release(client, &api, budget, item, written).await?;
    }
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: item.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let op = format!("delete {key}");
    let result = budget
        .run(&op, || async {
            api.delete(&key.name, &params).await.classify(|| op.clone())
        })
        .await;
    match result {
        // Gone already, or replaced by an object that is not ours (uid precondition failed).
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Before a rolled-back primary is deleted: marks it [`ROLLED_BACK`] and takes off the finalizers this
/// attempt put on it, in one JSON patch that applies only to the object created (its uid) with the
/// finalizers it was created with. A primary carries the cleanup finalizer, which only a monitor's
/// recorded end takes off: deleted with it, a job no attempt will run would stay, being deleted, and
/// read as an ended job by the submission's next delivery (which would publish QUEUED and drop the
/// submission), and as a job deleted before its end by its monitor (which would publish a FAILURE, or
/// `lost_track` once it vanished, of a job whose QUEUED it had told). Marked and without it, the job
/// goes at once, and every reader knows it for an attempt undone.
async fn release(
    client: &kube::Client,
    api: &Api<DynamicObject>,
    budget: &Budget<'_>,
    item: &Created,
    Release { ours, had }: &Release,
) -> Result<(), ClusterError> {
    let key = &item.key;
    let kept: Vec<&String> = had.iter().filter(|f| !ours.contains(f)).collect();
    let mut ops = Vec::new();
    if let Some(uid) = &item.uid {
        ops.push(json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    }
    if !had.is_empty() {
        ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": had}));
        ops.push(json!({"op": "replace", "path": "/metadata/finalizers", "value": kept}));
    }
    // A primary always has annotations (its fingerprint), so the key is added to them.
    ops.push(json!({
        "op": "add",
        "path": format!("/metadata/annotations/{}", ROLLED_BACK.replace('/', "~1")),
        "value": "true",
    }));
    let ops = Value::Array(ops);
    let url = format!(
        "{}/{}?fieldManager={FIELD_MANAGER}",
        api.resource_url(),
        key.name
    );
    let op = format!("release {key}");
    let result = budget
        .run(&op, || async {
            let request = json_patch_request(&url, &ops).classify(|| op.clone())?;
            client.request_text(request).await.classify(|| op.clone())
        })
        .await;
    match result {
        Ok(_) => Ok(()),
        // Gone already: nothing to delete either.
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Checks a plan and returns the primary's fingerprint. Pure.
fn check_plan(plan: &[Step], fingerprint_annotation: &str) -> Result<String, PlanError> {
    let invalid = |msg: String| Err(PlanError(msg));
    let mut primary: Option<&Step> = None;
    let mut seen = std::collections::HashSet::new();
    for step in plan {
        let key = step.key();
        if key.name.is_empty() {
            return invalid(format!("a {} has no metadata.name", key.kind));
        }
        if !seen.insert(key.clone()) {
            return invalid(format!("{key} appears twice"));
        }
        if step.role != Role::Shared && key.namespace.is_none() {
            return invalid(format!(
                "{key} has no metadata.namespace (only shared objects may be cluster-wide)"
            ));
        }
        match step.role {
            Role::Primary if primary.is_some() => {
                return invalid(format!("{key} is a second primary object"));
            }
            Role::Primary => primary = Some(step),
            Role::Companion => match primary {
                None => {
                    return invalid(format!(
                        "{key} comes before the primary object it must be owned by"
                    ));
                }
                Some(p) if p.metadata.namespace != key.namespace => {
                    return invalid(format!(
                        "{key} is not in the primary's namespace (an ownerReference cannot cross \
                         namespaces)"
                    ));
                }
                Some(_) => {}
            },
            Role::Shared => {}
        }
    }
    let Some(primary) = primary else {
        return invalid("there is no primary object".into());
    };
    match annotation(&primary.metadata, fingerprint_annotation) {
        Some(fp) if !fp.is_empty() => Ok(fp.to_owned()),
        _ => invalid(format!(
            "{} has no {fingerprint_annotation} annotation to recognise a redelivery by",
            primary.key()
        )),
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The ownerReference a companion gets to the primary, or `None` if the primary has no uid yet. Not a
/// blocking reference (`blockOwnerDeletion` needs extra RBAC on the owner's finalizers, and nothing
/// waits for companions when a job is deleted).
pub fn owner_reference(resource: &ApiResource, primary: &ObjectMeta) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: primary.name.clone()?,
        uid: primary.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Whether an existing primary has ended: being deleted (an older runner's release, or Volcano's TTL), or
/// in a phase Volcano gives a job it is ending or has finished (a `TerminateJob` command leaves it
/// `Terminating`, then `Terminated`, and keeps it until its `ttlSecondsAfterFinished`).
/// With `end_marker`, an annotation that records the end comes first (see [`Applier::with_end_marker`]).
fn has_ended(object: &DynamicObject, end_marker: Option<&str>) -> bool {
    object.metadata.deletion_timestamp.is_some()
        || end_marker.is_some_and(|k| annotation(&object.metadata, k).is_some())
        || object.data["status"]["state"]["phase"]
            .as_str()
            .is_some_and(|p| crate::volcano::JobPhase::from(p).is_ending())
}

/// `metadata` with `owner` among its ownerReferences, replacing a reference to the same kind and name (a
/// placeholder without the real uid, or a stale one).
fn with_owner(metadata: &ObjectMeta, owner: &OwnerReference) -> ObjectMeta {
    let mut metadata = metadata.clone();
    let refs = metadata.owner_references.get_or_insert_with(Vec::new);
    refs.retain(|r| !(r.kind == owner.kind && r.name == owner.name));
    refs.push(owner.clone());
    metadata
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A create asks for the metadata alone back, and for the object from a server that cannot: the
    /// applier reads only the answer's metadata, and a VolcanoJob's whole answer was most of the bytes a
    /// submission brought back.
    #[test]
    fn a_create_asks_for_the_metadata_alone_back() {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PostParams::default()
        };
        let request = create_request("/api/v1/namespaces/a/configmaps", &params, b"{}".to_vec())
            .expect("a request");
        assert_eq!(request.method(), http::Method::POST);
        let accept = request.headers()[http::header::ACCEPT].to_str().unwrap();
        let mut kinds = accept.split(", ");
        assert_eq!(
            kinds.next(),
            Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
        );
        assert_eq!(
            kinds.next(),
            Some("application/json"),
            "the object from a server that cannot"
        );
        assert!(request.uri().query().unwrap().contains("fieldManager="));
        // What an API server answers with it decodes as the applier reads it.
        let answer: Answer = serde_json::from_str(
            r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"x","uid":"u","resourceVersion":"7"}}"#,
        )
        .unwrap();
        assert_eq!(answer.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(answer.metadata.uid.as_deref(), Some("u"));
    }

    const FP: &str = "example.org/submissionHash";

    fn vcjob(ns: &str, name: &str, fingerprint: Option<&str>) -> Step {
        let mut value = json!({
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"minAvailable": 1}
        });
        if let Some(fp) = fingerprint {
            value["metadata"]["annotations"] = json!({ FP: fp });
        }
        Step::from_value(value, Role::Primary).unwrap()
    }

    fn companion(kind: &str, api_version: &str, ns: &str, name: &str) -> Step {
        Step::from_value(
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns}}),
            Role::Companion,
        )
        .unwrap()
    }

    fn namespace(name: &str) -> Step {
        Step::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            Role::Shared,
        )
        .unwrap()
    }

    #[test]
    fn resources_come_from_api_version_and_kind() {
        let job = vcjob("a", "j-1", Some("x"));
        assert_eq!(job.resource.group, "batch.volcano.sh");
        assert_eq!(job.resource.version, "v1alpha1");
        assert_eq!(job.resource.plural, "jobs");
        let np = companion("NetworkPolicy", "networking.k8s.io/v1", "a", "p");
        assert_eq!(np.resource.plural, "networkpolicies");
        let svc = companion("Service", "v1", "a", "s");
        assert_eq!(svc.resource.group, "");
        assert_eq!(svc.resource.plural, "services");
        assert!(Step::from_value(json!({"metadata": {"name": "x"}}), Role::Shared).is_err());
    }

    #[test]
    fn a_step_holds_the_object_as_serde_would_decode_it() {
        let value = json!({
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "j-1", "namespace": "a", "annotations": {"k": "v"}},
            "spec": {"queue": "q", "tasks": [{"name": "t", "replicas": 2}]},
            "status": null,
        });
        let step = Step::from_value(value.clone(), Role::Primary).unwrap();
        let decoded: DynamicObject = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(step.object().unwrap(), decoded);
        assert_eq!(serde_json::to_value(step.object().unwrap()).unwrap(), value);
        assert_eq!(step.resource.plural, "jobs");
        // What is sent is the object itself, whatever order its fields come in.
        let body: serde_json::Value = serde_json::from_slice(&step.body(None).unwrap()).unwrap();
        assert_eq!(body, value);
        let bare = Step::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
            Role::Shared,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&bare.body(None).unwrap()).unwrap(),
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}"#
        );
        // The metadata comes first, after `apiVersion` and `kind`, whatever the other fields are
        // called (a JSON object keeps them sorted: `data` would come before `metadata`).
        let cm = Step::from_value(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"},
                   "metadata": {"name": "a", "namespace": "b"}, "immutable": true}),
            Role::Companion,
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&cm.body(None).unwrap()).unwrap(),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"b"},"data":{"k":"v"},"immutable":true}"#
        );
    }

    #[test]
    fn a_step_from_a_malformed_object_says_which_field_is_wrong() {
        let err = |v: serde_json::Value| Step::from_value(v, Role::Primary).unwrap_err().0;
        assert!(err(json!("a string")).contains("not a JSON object"));
        let kind = err(json!({"apiVersion": "v1", "kind": 7, "metadata": {"name": "x"}}));
        assert!(kind.contains("`kind` is 7"), "{kind}");
        let meta = err(json!({"apiVersion": "v1", "kind": "ConfigMap"}));
        assert!(meta.contains("no metadata"), "{meta}");
        let labels =
            err(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": 1}}));
        assert!(labels.contains("metadata"), "{labels}");
    }

    #[test]
    fn typed_objects_become_steps() {
        let cm = k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("j-1-etc".into()),
                namespace: Some("a".into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), "v".to_owned())].into()),
            ..Default::default()
        };
        let step = Step::from_typed(&cm, Role::Companion).unwrap();
        assert_eq!(step.resource.plural, "configmaps");
        assert_eq!(step.types.kind, "ConfigMap");
        assert_eq!(step.object().unwrap().data["data"]["k"], "v");
        assert_eq!(step.key().to_string(), "ConfigMap a/j-1-etc");
    }

    /// What a step sends for a typed object is the object as serde_json writes it, byte for byte: every
    /// field in the type's own order and form (the metadata among the others where the type puts it),
    /// metadata fields that are present but empty kept so.
    #[test]
    fn a_typed_object_is_sent_as_serde_json_writes_it() {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodTemplateSpec};

        fn sent<K>(object: &K) -> String
        where
            K: Resource<DynamicType = ()> + Serialize,
        {
            let step = Step::from_typed(object, Role::Companion).unwrap();
            let sent = String::from_utf8(step.body(None).unwrap()).unwrap();
            assert_eq!(sent, serde_json::to_string(object).unwrap());
            sent
        }

        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("j-1-etc".into()),
                namespace: Some("a".into()),
                labels: Some(
                    [
                        ("z".to_owned(), "1".to_owned()),
                        ("a".to_owned(), "2".to_owned()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            immutable: Some(true),
            data: Some([("k".to_owned(), "v\"\n".to_owned())].into()),
            ..ConfigMap::default()
        };
        // k8s-openapi writes a ConfigMap's fields in alphabetical order, `metadata` last.
        let text = sent(&cm);
        assert!(
            text.starts_with(r#"{"apiVersion":"v1","kind":"ConfigMap","data":{"#),
            "{text}"
        );
        assert!(text.contains(r#""immutable":true,"metadata":{"#), "{text}");

        let mut job = crate::volcano::VolcanoJob::default();
        job.metadata.name = Some("j-1".into());
        job.metadata.namespace = Some("a".into());
        job.metadata.annotations = Some([(FP.to_owned(), "sha256:1".to_owned())].into());
        job.spec.scheduler_name = Some("volcano".into());
        job.spec.min_available = Some(2);
        job.spec.queue = Some("q".into());
        job.spec.tasks = vec![crate::volcano::TaskSpec {
            name: "job".into(),
            replicas: 2,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some([("x".to_owned(), "y".to_owned())].into()),
                    ..ObjectMeta::default()
                }),
                spec: None,
            },
            ..crate::volcano::TaskSpec::default()
        }];
        let text = sent(&job);
        // The type's own field order, not a sorted one (`schedulerName` comes before `minAvailable`).
        let (scheduler, min) = (text.find("schedulerName"), text.find("\"minAvailable\":2"));
        assert!(scheduler < min && min.is_some(), "{text}");
        let step = Step::from_typed(&job, Role::Primary).unwrap();
        assert_eq!(step.types.api_version, "batch.volcano.sh/v1alpha1");
        assert_eq!(step.types.kind, "Job");
        assert_eq!(step.resource.plural, "jobs");
        assert_eq!(step.metadata, job.metadata);

        let empty = Namespace {
            metadata: ObjectMeta {
                name: Some("alice".into()),
                labels: Some(Default::default()),
                annotations: Some(Default::default()),
                finalizers: Some(Vec::new()),
                owner_references: Some(Vec::new()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        assert!(sent(&empty).contains(r#""labels":{}"#));
        assert_eq!(
            sent(&Namespace::default()),
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{}}"#
        );
    }

    /// The fields a step keeps come out of a map as out of a struct (a type with a flattened field
    /// serialises as a map); anything else is refused as not an object.
    #[test]
    fn the_fields_kept_as_text_leave_out_the_typed_ones() {
        let fields = |value: &serde_json::Value| top_level_fields(value);
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "data": {"metadata": "kept: not at the top"},
            "metadata": {"name": "x"},
            "immutable": true,
        });
        // A map of serde_json's writes its keys in order: `metadata` after `immutable`.
        let (text, at) = fields(&object).unwrap();
        assert_eq!(
            text,
            r#"{"data":{"metadata":"kept: not at the top"},"immutable":true}"#
        );
        assert_eq!(
            &text[..at],
            r#"{"data":{"metadata":"kept: not at the top"},"immutable":true"#
        );
        assert_eq!(
            fields(&json!({"metadata": {}})).unwrap(),
            ("{}".to_owned(), 1)
        );
        assert_eq!(
            fields(&json!({"a": 1, "metadata": {}})).unwrap(),
            (r#"{"a":1}"#.to_owned(), 6)
        );
        let refused = fields(&json!(["a"])).unwrap_err().to_string();
        assert!(
            refused.contains("not a Kubernetes object: it serialises as an array"),
            "{refused}"
        );
        assert!(fields(&json!("a")).is_err());
    }

    #[test]
    fn a_good_plan_passes_and_yields_the_fingerprint() {
        let plan = [
            namespace("a"),
            vcjob("a", "j-1", Some("sha256:1")),
            companion("Service", "v1", "a", "j-1"),
        ];
        assert_eq!(check_plan(&plan, FP).unwrap(), "sha256:1");
    }

    #[test]
    fn bad_plans_are_refused_with_a_reason() {
        let cases: Vec<(Vec<Step>, &str)> = vec![
            (vec![namespace("a")], "no primary"),
            (
                vec![
                    companion("Service", "v1", "a", "s"),
                    vcjob("a", "j", Some("1")),
                ],
                "before the primary",
            ),
            (vec![vcjob("a", "j", None)], "annotation"),
            (
                vec![vcjob("a", "j", Some("1")), vcjob("a", "k", Some("1"))],
                "second primary",
            ),
            (
                vec![
                    vcjob("a", "j", Some("1")),
                    companion("Service", "v1", "b", "s"),
                ],
                "namespace",
            ),
            (
                vec![
                    vcjob("a", "j", Some("1")),
                    companion("Service", "v1", "a", "j-1"),
                    companion("Service", "v1", "a", "j-1"),
                ],
                "twice",
            ),
        ];
        for (plan, why) in cases {
            let err = check_plan(&plan, FP).unwrap_err().to_string();
            assert!(err.contains(why), "{err} should mention {why}");
        }
        let mut cluster_wide = companion("Service", "v1", "a", "s");
        cluster_wide.metadata.namespace = None;
        let err = check_plan(&[vcjob("a", "j", Some("1")), cluster_wide], FP).unwrap_err();
        assert!(err.to_string().contains("no metadata.namespace"), "{err}");
        let queue = Step::from_value(
            json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"}}),
            Role::Shared,
        )
        .unwrap();
        assert_eq!(queue.resource.plural, "queues");
        check_plan(&[queue, vcjob("a", "j", Some("1"))], FP)
            .expect("a cluster-wide shared queue is fine");
    }

    #[test]
    fn owner_references_replace_placeholders() {
        let job = vcjob("a", "j-1", Some("1"));
        let mut created = job.metadata.clone();
        assert!(
            owner_reference(&job.resource, &created).is_none(),
            "no uid yet"
        );
        created.uid = Some("uid-1".into());
        let owner = owner_reference(&job.resource, &created).unwrap();
        assert_eq!(owner.api_version, "batch.volcano.sh/v1alpha1");
        assert_eq!(owner.kind, "Job");
        assert_eq!(owner.name, "j-1");
        assert_eq!(owner.controller, Some(true));

        let mut svc = companion("Service", "v1", "a", "j-1");
        svc.metadata.owner_references = Some(vec![
            OwnerReference {
                uid: String::new(),
                ..owner.clone()
            },
            OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "other".into(),
                uid: "u2".into(),
                controller: None,
                block_owner_deletion: None,
            },
        ]);
        let owned: DynamicObject =
            serde_json::from_slice(&svc.body(Some(&owner)).unwrap()).unwrap();
        let refs = owned.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 2);
        assert!(refs.iter().any(|r| r.uid == "uid-1"));
        assert!(refs.iter().all(|r| !r.uid.is_empty()));
        // The step itself is left as it was, the rest of the object sent as it is.
        assert_eq!(svc.metadata.owner_references.as_ref().unwrap()[0].uid, "");
        assert_eq!(owned.data, svc.object().unwrap().data);
    }

    #[test]
    fn errors_say_what_to_do() {
        let conflict = ApplyError::Conflict {
            object: vcjob("a", "j-1", Some("1")).key(),
            role: Role::Primary,
            existing: Some("sha256:other".into()),
            desired: "sha256:mine".into(),
            rollback: Rollback::default(),
        };
        assert!(conflict.is_duplicate());
        assert_eq!(conflict.class(), ErrorClass::Permanent);
        assert!(conflict.to_string().contains("Job a/j-1"));
        let transient = ApplyError::Cluster {
            object: vcjob("a", "j-1", Some("1")).key(),
            source: ClusterError::Unavailable {
                op: "create Job a/j-1".into(),
                message: "503".into(),
                retry_after: None,
            },
            rollback: Rollback {
                deleted: vec![companion("Service", "v1", "a", "s").key()],
                failed: vec![],
            },
        };
        assert!(transient.is_retryable());
        assert!(
            transient
                .to_string()
                .ends_with("removed again: Service a/s"),
            "{transient}"
        );
    }
}
