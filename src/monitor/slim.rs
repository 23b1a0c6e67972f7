//! What the monitor decodes of the objects its watches bring: only the fields it reads.
//!
//! Decoding watch events was most of a monitored runner's work (callgrind, issue 46: 63% of its
//! instructions went to `serde_json` building whole objects). A skipped field is still read through
//! (JSON has no lengths), but as `serde`'s `IgnoredAny`: nothing is allocated or converted for it. So
//! what is decoded here is what costs: this module names it, field by field.
//!
//! Of every object's metadata ([`meta`]): name, namespace, uid, resourceVersion, creation and deletion
//! timestamps, labels, annotations, finalizers and owner references. Not `managedFields` (on a real API
//! server a list of field sets per writer, each a JSON tree, often the largest part of a pod's
//! metadata), `generation`, `generateName`, `selfLink` nor `deletionGracePeriodSeconds`: nothing in the
//! monitor reads them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// The metadata fields the monitor reads (see the module documentation).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

/// Decodes an object's `metadata` with only the fields the monitor reads (a `deserialize_with` for
/// the slim read types' `metadata`); `null` is empty metadata, as a missing one.
pub fn meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Some(m) = Option::<Meta>::deserialize(d)? else {
        return Ok(ObjectMeta::default());
    };
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        labels: m.labels,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
    })
}
