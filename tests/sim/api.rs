//! The simulator's Kubernetes API through the real kube client: discovery, CRUD, errors, optimistic
//! concurrency, every patch kind, subresources, selectors, pagination, deletion semantics, CRD validation.

use crate::sim_support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::params::Preconditions;
use kube::discovery::{Discovery, Scope};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use sim_support::*;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "30"],
                                 "env": [{"name": "A", "value": "1"}]}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn discovery_finds_builtin_and_volcano_kinds() {
    let (_sim, client) = start().await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let group = discovery
        .get("batch.volcano.sh")
        .expect("volcano batch group");
    let (ar, caps) = group.recommended_kind("Job").expect("Job kind");
    assert_eq!(ar.plural, "jobs");
    assert_eq!(caps.scope, Scope::Namespaced);
    assert!(caps.subresources.iter().any(|(s, _)| s.plural == "status"));
    let (q, qcaps) = discovery
        .get("scheduling.volcano.sh")
        .unwrap()
        .recommended_kind("Queue")
        .unwrap();
    assert_eq!((q.plural.as_str(), qcaps.scope), ("queues", Scope::Cluster));
    let core = discovery.get("").expect("core group");
    assert!(core.recommended_kind("Pod").is_some());
    assert!(
        discovery
            .get("coordination.k8s.io")
            .unwrap()
            .recommended_kind("Lease")
            .is_some()
    );

    let aggregated = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .expect("aggregated discovery");
    let (pg, _) = aggregated
        .get("scheduling.volcano.sh")
        .unwrap()
        .recommended_kind("PodGroup")
        .unwrap();
    assert_eq!(pg.plural, "podgroups");
    assert!(
        aggregated
            .get("")
            .unwrap()
            .recommended_kind("Namespace")
            .is_some()
    );

    let version = client.apiserver_version().await.expect("/version");
    assert_eq!(version.major, "1");
}

#[tokio::test]
async fn typed_crud_with_errors_of_the_right_shape() {
    let (_sim, client) = start().await;
    namespace(&client, "crud").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "crud");
    let created = api
        .create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("crud"));
    assert_eq!(meta.generation, Some(1));
    assert!(meta.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_ref().unwrap().parse().unwrap();

    let dup = api
        .create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(&dup), 409);
    assert_eq!(status(&dup).reason, "AlreadyExists");
    assert_eq!(status(&dup).message, "configmaps \"one\" already exists");

    let missing = api.get("nope").await.unwrap_err();
    assert_eq!(code(&missing), 404);
    assert_eq!(status(&missing).reason, "NotFound");
    assert!(api.get_opt("nope").await.unwrap().is_none());

    let other_ns = Api::<ConfigMap>::namespaced(client.clone(), "absent")
        .create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap_err();
    assert_eq!(status(&other_ns).message, "namespaces \"absent\" not found");

    // Replace with the current resourceVersion works; the old one conflicts.
    let mut changed = created.clone();
    changed.data = Some(BTreeMap::from([("k".to_string(), "w".to_string())]));
    let replaced = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = replaced
        .metadata
        .resource_version
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1, "resourceVersion grows: {rv1} -> {rv2}");
    let stale = api
        .replace("one", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(code(&stale), 409);
    assert_eq!(status(&stale).reason, "Conflict");
    assert!(
        status(&stale)
            .message
            .contains("the object has been modified"),
        "{}",
        status(&stale).message
    );

    // Invalid names are 422 with the field.
    let bad = api
        .create(&PostParams::default(), &cm("Not_Valid", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(&bad), 422);
    assert_eq!(status(&bad).reason, "Invalid");
    assert!(status(&bad).message.starts_with(
        "ConfigMap \"Not_Valid\" is invalid: metadata.name: Invalid value: \"Not_Valid\""
    ));

    // Delete returns a Status when the object is gone.
    let deleted = api.delete("one", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_right());
    assert_eq!(code(&api.get("one").await.unwrap_err()), 404);
}

#[tokio::test]
async fn volcano_jobs_through_dynamic_objects() {
    let (_sim, client) = start().await;
    namespace(&client, "dyn").await;
    let api = jobs(&client, "dyn");
    let job = dynamic(gang_job("j-1", "dyn", 1, "1", &["sleep", "10"]));
    let created = api.create(&PostParams::default(), &job).await.unwrap();
    // The mutating webhook and the CRD defaults filled in what the job left out.
    assert_eq!(created.data["spec"]["schedulerName"], "volcano");
    assert_eq!(created.data["spec"]["maxRetry"], 3);
    assert_eq!(created.data["spec"]["tasks"][0]["minAvailable"], 1);
    let got = api.get("j-1").await.unwrap();
    assert_eq!(got.uid(), created.uid());
    assert_eq!(phase(&got), "Pending", "the controller saw it");
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &vcjob());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn every_patch_kind() {
    let (_sim, client) = start().await;
    namespace(&client, "patch").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "patch");
    api.create(&PostParams::default(), &cm("p", &[("a", "1")]))
        .await
        .unwrap();

    // JSON merge patch: add and remove.
    let merged = merge(
        &api,
        "p",
        json!({"metadata": {"labels": {"a": null, "b": "2"}}, "data": {"x": "y"}}),
    )
    .await
    .unwrap();
    assert_eq!(merged.labels().get("b").map(String::as_str), Some("2"));
    assert!(!merged.labels().contains_key("a"));
    assert_eq!(merged.data.as_ref().unwrap()["x"], "y");

    // JSON patch with `test`: applies when the test holds, 422 and no change when it does not.
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/x", "value": "y"},
        {"op": "replace", "path": "/data/x", "value": "z"}
    ]))
    .unwrap();
    let patched = api
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["x"], "z");
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/x", "value": "y"},
        {"op": "replace", "path": "/data/x", "value": "never"}
    ]))
    .unwrap();
    let err = api
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(failing))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(api.get("p").await.unwrap().data.unwrap()["x"], "z");

    // A merge patch carrying a stale resourceVersion conflicts.
    let stale = merge(
        &api,
        "p",
        json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "q"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(code(&stale), 409);

    // Server-side apply creates, then merges; it needs a field manager.
    let applied = api
        .patch("ssa", &PatchParams::apply("volcano-runner"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}})))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["a"], "1");
    assert_eq!(
        applied.metadata.managed_fields.unwrap()[0]
            .manager
            .as_deref(),
        Some("volcano-runner")
    );
    let applied = api
        .patch("ssa", &PatchParams::apply("volcano-runner").force(), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"b": "2"}})))
        .await
        .unwrap();
    let data = applied.data.unwrap();
    assert_eq!((data["a"].as_str(), data["b"].as_str()), ("1", "2"));
    let no_manager = api
        .patch(
            "ssa",
            &PatchParams::default(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&no_manager), 422);

    // Strategic merge on a pod merges containers and env by name.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "patch");
    pods.create(&PostParams::default(), &pod("sp"))
        .await
        .unwrap();
    let smp = json!({"metadata": {"labels": {"x": "1"}}, "spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}});
    let p = pods
        .patch("sp", &PatchParams::default(), &Patch::Strategic(smp))
        .await
        .unwrap();
    let c = &p.spec.unwrap().containers[0];
    assert_eq!(c.image.as_deref(), Some("busybox:1.37"));
    assert_eq!(
        c.env.as_ref().unwrap()[0].name,
        "A",
        "env survived the strategic merge"
    );
    let forbidden = pods
        .patch(
            "sp",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "command": ["true"]}]}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(
        code(&forbidden),
        422,
        "pod specs are immutable except images"
    );

    // Strategic merge is refused for custom resources, as a real API server does.
    let jobs = jobs(&client, "patch");
    jobs.create(
        &PostParams::default(),
        &dynamic(gang_job("j", "patch", 1, "1", &["sleep", "1"])),
    )
    .await
    .unwrap();
    let e = jobs
        .patch(
            "j",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 415);
    let ok = merge(
        &jobs,
        "j",
        json!({"metadata": {"annotations": {"ucloud.dk/expiry": "123"}}}),
    )
    .await
    .unwrap();
    assert_eq!(ok.annotations()["ucloud.dk/expiry"], "123");
}

#[tokio::test]
async fn status_subresource_of_vcjobs() {
    let (_sim, client) = start().await;
    namespace(&client, "st").await;
    let api = jobs(&client, "st");
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("j", "st", 1, "1", &["sleep", "100"])),
    )
    .await
    .unwrap();
    // A status change through the main resource is ignored.
    let main = merge(&api, "j", json!({"status": {"retryCount": 9}}))
        .await
        .unwrap();
    assert_ne!(main.data["status"]["retryCount"], 9);
    // Through /status it sticks, and spec changes there are ignored.
    let st = api
        .patch_status(
            "j",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"retryCount": 2}, "spec": {"maxRetry": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["retryCount"], 2);
    assert_eq!(st.data["spec"]["maxRetry"], 3);
    let got = api.get_status("j").await.unwrap();
    assert_eq!(got.data["status"]["retryCount"], 2);
    // A wrong type in status is refused by the schema.
    let bad = api
        .patch_status(
            "j",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"running": "lots"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&bad), 422);
}

#[tokio::test]
async fn podgroup_status_follows_the_real_crd() {
    // Volcano's PodGroup CRD declares no status subresource: status is written through the object
    // itself, and /status does not exist.
    let (_sim, client) = start().await;
    namespace(&client, "pg").await;
    let api = podgroups(&client, "pg");
    let pg = dynamic(
        json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "manual"}, "spec": {"minMember": 1, "queue": "default"}, "status": {"phase": "Pending"}}),
    );
    let created = api.create(&PostParams::default(), &pg).await.unwrap();
    assert_eq!(
        created.data["status"]["phase"], "Pending",
        "kept on create without a status subresource"
    );
    let patched = merge(&api, "manual", json!({"status": {"running": 1}}))
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["running"], 1);
    let err = api
        .patch_status(
            "manual",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"running": 2}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 404);
}

#[tokio::test]
async fn label_and_field_selectors_and_pagination() {
    let (_sim, client) = start().await;
    namespace(&client, "sel").await;
    namespace(&client, "sel2").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "sel");
    for (name, tier, app) in [
        ("a", "db", "x"),
        ("b", "web", "x"),
        ("c", "web", "y"),
        ("d", "cache", ""),
    ] {
        let labels: Vec<(&str, &str)> = if app.is_empty() {
            vec![("tier", tier)]
        } else {
            vec![("tier", tier), ("app", app)]
        };
        api.create(&PostParams::default(), &cm(name, &labels))
            .await
            .unwrap();
    }
    Api::<ConfigMap>::namespaced(client.clone(), "sel2")
        .create(&PostParams::default(), &cm("a", &[("tier", "db")]))
        .await
        .unwrap();
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier=web"))
                .await
                .unwrap()
        ),
        vec!["b", "c"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier in (db,cache)"))
                .await
                .unwrap()
        ),
        vec!["a", "d"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("tier notin (web),app"))
                .await
                .unwrap()
        ),
        vec!["a"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("!app"))
                .await
                .unwrap()
        ),
        vec!["d"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("app!=x"))
                .await
                .unwrap()
        ),
        vec!["c", "d"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    let all: Api<ConfigMap> = Api::all(client.clone());
    let in_sel2 = all
        .list(&ListParams::default().fields("metadata.namespace=sel2"))
        .await
        .unwrap();
    assert_eq!(in_sel2.items.len(), 1);
    assert_eq!(in_sel2.items[0].namespace().as_deref(), Some("sel2"));
    let bad = api
        .list(&ListParams::default().fields("data.k=v"))
        .await
        .unwrap_err();
    assert_eq!(
        (code(&bad), status(&bad).message.as_str()),
        (400, "field label not supported: data.k")
    );
    let bad = api
        .list(&ListParams::default().labels("tier in web"))
        .await
        .unwrap_err();
    assert_eq!(code(&bad), 400);

    // Pages of 2, with continue tokens, cover everything once.
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(first.clone()), vec!["a", "b"]);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(second.clone()), vec!["c", "d"]);
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "pages share one resourceVersion"
    );
    assert!(second.metadata.continue_.is_none_or(|c| c.is_empty()));

    // Pods support the kubelet's field selectors.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "sel");
    pods.create(&PostParams::default(), &pod("p1"))
        .await
        .unwrap();
    let pending = pods
        .list(&ListParams::default().fields("status.phase=Pending"))
        .await
        .unwrap();
    assert_eq!(pending.items.len(), 1);
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=nowhere"))
        .await
        .unwrap();
    assert!(on_node.items.is_empty());
}

#[tokio::test]
async fn cascading_deletes_follow_owner_references() {
    let (sim, client) = start().await;
    namespace(&client, "gc").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "gc");
    let owned = |name: &str, owner: &ConfigMap| -> ConfigMap {
        let mut c = cm(name, &[]);
        c.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(), "uid": owner.uid().unwrap(), "blockOwnerDeletion": true
        })).unwrap()]);
        c
    };
    // Background: the owner goes at once, the dependent right after.
    let owner = api
        .create(&PostParams::default(), &cm("owner", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned("dep", &owner))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    assert_eq!(code(&api.get("dep").await.unwrap_err()), 404);

    // Foreground: with a dependent held by a finalizer, the owner stays (deletionTimestamp set) until
    // the dependent is gone.
    let owner = api
        .create(&PostParams::default(), &cm("owner2", &[]))
        .await
        .unwrap();
    let mut held = owned("held", &owner);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let d = api
        .delete("owner2", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(d.is_left(), "deletion in progress");
    let waiting = api.get("owner2").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        waiting
            .finalizers()
            .contains(&"foregroundDeletion".to_string())
    );
    assert!(
        api.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    merge(&api, "held", json!({"metadata": {"finalizers": null}}))
        .await
        .unwrap();
    assert_eq!(code(&api.get("held").await.unwrap_err()), 404);
    assert_eq!(code(&api.get("owner2").await.unwrap_err()), 404);

    // An owner that its own finalizer holds after a background delete keeps its dependents; a second
    // delete asking for the foreground removes them while the finalizer still holds the owner.
    let mut kept = cm("kept", &[]);
    kept.metadata.finalizers = Some(vec!["example.com/record".into()]);
    let owner = api.create(&PostParams::default(), &kept).await.unwrap();
    api.create(&PostParams::default(), &owned("companion", &owner))
        .await
        .unwrap();
    api.delete("kept", &DeleteParams::background())
        .await
        .unwrap();
    assert!(
        api.get("companion").await.is_ok(),
        "background: dependents wait for the owner"
    );
    api.delete("kept", &DeleteParams::foreground())
        .await
        .unwrap();
    assert_eq!(code(&api.get("companion").await.unwrap_err()), 404);
    let record = api.get("kept").await.unwrap();
    assert!(record.metadata.deletion_timestamp.is_some());
    assert_eq!(record.finalizers(), ["example.com/record".to_string()]);

    // Orphan: the dependent stays and loses its owner reference.
    let owner = api
        .create(&PostParams::default(), &cm("owner3", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned("orphan", &owner))
        .await
        .unwrap();
    api.delete("owner3", &DeleteParams::orphan()).await.unwrap();
    let orphan = api.get("orphan").await.unwrap();
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // An object whose owner never existed is collected.
    let mut dangling = cm("dangling", &[]);
    dangling.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-0000-4000-8000-000000000000"
    })).unwrap()]);
    api.create(&PostParams::default(), &dangling).await.unwrap();
    assert_eq!(code(&api.get("dangling").await.unwrap_err()), 404);

    // Preconditions on delete.
    let p = api
        .create(&PostParams::default(), &cm("pre", &[]))
        .await
        .unwrap();
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(code(&api.delete("pre", &wrong).await.unwrap_err()), 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert!(api.delete("pre", &right).await.unwrap().is_right());
    drop(sim);
}

#[tokio::test]
async fn namespace_deletion_removes_its_contents() {
    let (sim, client) = start().await;
    namespace(&client, "doomed").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    cms.create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();
    let jobs_api = jobs(&client, "doomed");
    jobs_api
        .create(
            &PostParams::default(),
            &dynamic(gang_job("j", "doomed", 1, "1", &["sleep", "100"])),
        )
        .await
        .unwrap();
    sim.advance(std::time::Duration::from_secs(2));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "the job's pod runs"
    );

    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let ns = nss.get("doomed").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert!(
        cms.get_opt("c").await.unwrap().is_none(),
        "config maps go at once"
    );
    let refused = cms
        .create(&PostParams::default(), &cm("late", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(&refused), 403);
    assert!(
        status(&refused)
            .message
            .contains("because it is being terminated")
    );
    // The running pod needs its termination time; then the namespace is gone.
    sim.advance(std::time::Duration::from_secs(2));
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(code(&nss.get("doomed").await.unwrap_err()), 404);
}

#[tokio::test]
async fn crd_schema_validation_and_pruning() {
    let (_sim, client) = start().await;
    namespace(&client, "val").await;
    let api = jobs(&client, "val");
    let mut wrong = gang_job("j-1", "val", 1, "1", &["sleep", "1"]);
    wrong["spec"]["tasks"][0]["replicas"] = json!("string");
    let err = api
        .create(&PostParams::default(), &dynamic(wrong))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(status(&err).reason, "Invalid");
    assert_eq!(
        status(&err).message,
        "Job.batch.volcano.sh \"j-1\" is invalid: spec.tasks[0].replicas: Invalid value: \"string\": spec.tasks[0].replicas in body must be of type integer: \"string\""
    );
    let causes = &status(&err).details.as_ref().unwrap().causes;
    assert_eq!(causes[0].field, "spec.tasks[0].replicas");

    // Unknown fields are pruned (with a warning), or refused under strict validation.
    let mut extra = gang_job("j-2", "val", 1, "1", &["sleep", "1"]);
    extra["spec"]["surprise"] = json!(true);
    extra["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["bogus"] = json!(1);
    let created = api
        .create(&PostParams::default(), &dynamic(extra.clone()))
        .await
        .unwrap();
    assert!(created.data["spec"].get("surprise").is_none());
    assert!(
        created.data["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
            .get("bogus")
            .is_none()
    );
    extra["metadata"]["name"] = json!("j-3");
    let strict = api
        .patch(
            "j-3",
            &PatchParams::apply("t").validation_strict(),
            &Patch::Apply(extra),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&strict), 400);
    assert!(
        status(&strict)
            .message
            .contains("unknown field \"spec.surprise\""),
        "{}",
        status(&strict).message
    );

    // Enum and pattern checks come from the CRD too.
    let mut bad_name = gang_job("j-4", "val", 1, "1", &["sleep", "1"]);
    bad_name["spec"]["tasks"][0]["name"] = json!("Bad_Task");
    let err = api
        .create(&PostParams::default(), &dynamic(bad_name))
        .await
        .unwrap_err();
    assert!(status(&err).message.contains("spec.tasks[0].name: Invalid value: \"Bad_Task\": spec.tasks[0].name in body should match"), "{}", status(&err).message);
}

#[tokio::test]
async fn leases_for_leader_election() {
    let (_sim, client) = start().await;
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    let lease = serde_json::from_value(json!({"metadata": {"name": "runner-monitor"},
        "spec": {"holderIdentity": "runner-a", "leaseDurationSeconds": 15, "renewTime": "2026-01-01T00:00:00.000000Z"}})).unwrap();
    let created = api.create(&PostParams::default(), &lease).await.unwrap();
    // Two runners race with the same resourceVersion: one wins.
    let mut a = created.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("runner-a".into());
    let mut b = created.clone();
    b.spec.as_mut().unwrap().holder_identity = Some("runner-b".into());
    a.spec.as_mut().unwrap().lease_duration_seconds = Some(16);
    b.spec.as_mut().unwrap().lease_duration_seconds = Some(17);
    api.replace("runner-monitor", &PostParams::default(), &a)
        .await
        .unwrap();
    let lost = api
        .replace("runner-monitor", &PostParams::default(), &b)
        .await
        .unwrap_err();
    assert_eq!(code(&lost), 409);
    assert_eq!(
        api.get("runner-monitor")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("runner-a")
    );
}

#[tokio::test]
async fn kube_runtime_event_recorder_and_delete_collection() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (_sim, client) = start().await;
    namespace(&client, "ev").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ev");
    let target = cms
        .create(&PostParams::default(), &cm("target", &[("app", "x")]))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "volcano-runner".into(),
            instance: Some("runner-0".into()),
        },
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Submitted".into(),
                note: Some("job accepted".into()),
                action: "Submit".into(),
                secondary: None,
            },
            &target.object_ref(&()),
        )
        .await
        .expect("events.k8s.io/v1 events are served");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "ev");
    let list = events
        .list(&ListParams::default().fields("reason=Submitted"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].regarding.as_ref().unwrap().name.as_deref(),
        Some("target")
    );

    cms.create(&PostParams::default(), &cm("other", &[("app", "y")]))
        .await
        .unwrap();
    let gone = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap();
    let names: Vec<String> = gone
        .left()
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(names, vec!["target"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(left, vec!["other"]);
}

#[tokio::test]
async fn metadata_only_requests() {
    let (_sim, client) = start().await;
    namespace(&client, "meta").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "meta");
    api.create(&PostParams::default(), &cm("m", &[("a", "b")]))
        .await
        .unwrap();
    let m = api.get_metadata("m").await.unwrap();
    assert_eq!(m.metadata.labels.unwrap()["a"], "b");
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let raw: Value = serde_json::to_value(&list.items[0]).unwrap();
    assert!(raw.get("data").is_none());
}

/// A create, an update and a patch asked for `PartialObjectMetadata` answer with the written object's
/// metadata alone, at the version written, as an API server answers in the representation a write
/// negotiated (the runner's creates ask for it: `cluster::apply::CREATE_ACCEPT`); without the ask, the
/// whole object.
#[tokio::test]
async fn writes_answer_with_the_metadata_alone_when_asked() {
    let (_sim, client) = start().await;
    namespace(&client, "meta-writes").await;
    let url = "/api/v1/namespaces/meta-writes/configmaps";
    let accept = volcano_runner::cluster::apply::CREATE_ACCEPT;
    let send = |request: http::Request<Vec<u8>>| {
        let client = client.clone();
        async move {
            client
                .request_text(request)
                .await
                .map(|t| serde_json::from_str::<Value>(&t).unwrap())
        }
    };
    let with_accept = |mut request: http::Request<Vec<u8>>| {
        request
            .headers_mut()
            .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
        request
    };
    let body = serde_json::to_vec(&cm("w", &[("a", "b")])).unwrap();
    let create = kube::core::Request::new(url)
        .create(&PostParams::default(), body)
        .unwrap();
    let created = send(with_accept(create)).await.unwrap();
    assert_eq!(created["kind"], "PartialObjectMetadata", "{created}");
    assert_eq!(created["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(created["metadata"]["name"], "w");
    assert_eq!(created["metadata"]["labels"]["a"], "b");
    assert!(created.get("data").is_none(), "{created}");
    let created_version = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let patch = kube::core::Request::new(url)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "patched"}})),
        )
        .unwrap();
    let patched = send(with_accept(patch)).await.unwrap();
    assert_eq!(patched["kind"], "PartialObjectMetadata", "{patched}");
    assert!(patched.get("data").is_none());
    let patched_version = patched["metadata"]["resourceVersion"].as_str().unwrap();
    assert_ne!(
        patched_version, created_version,
        "the answer is the version written"
    );

    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "meta-writes");
    let whole = api.get("w").await.unwrap();
    assert_eq!(
        whole.metadata.resource_version.as_deref(),
        Some(patched_version)
    );
    let update_body = serde_json::to_vec(&whole).unwrap();
    let update = kube::core::Request::new(url)
        .replace("w", &PostParams::default(), update_body)
        .unwrap();
    let updated = send(with_accept(update)).await.unwrap();
    assert_eq!(updated["kind"], "PartialObjectMetadata", "{updated}");

    // Without the ask: the whole object, as before.
    let body = serde_json::to_vec(&cm("plain", &[])).unwrap();
    let create = kube::core::Request::new(url)
        .create(&PostParams::default(), body)
        .unwrap();
    let plain = send(create).await.unwrap();
    assert_eq!(plain["kind"], "ConfigMap", "{plain}");
    assert_eq!(plain["data"]["k"], "v");
}

/// The simulator counts every API request by verb and resource (what `volcano-runner bench` reports per
/// job): creates, gets, lists, patches of a subresource, each under its own name.
#[tokio::test]
async fn requests_are_counted_by_verb_and_resource() {
    let (sim, client) = start().await;
    namespace(&client, "counted").await;
    let before = sim.request_counts();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "counted");
    api.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("b", &[]))
        .await
        .unwrap();
    api.get("a").await.unwrap();
    api.list(&ListParams::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "counted");
    pods.create(&PostParams::default(), &pod("p"))
        .await
        .unwrap();
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"message": "counted"}})),
    )
    .await
    .unwrap();
    let after = sim.request_counts();
    let delta =
        |kind: &str| after.get(kind).copied().unwrap_or(0) - before.get(kind).copied().unwrap_or(0);
    assert_eq!(delta("create configmaps"), 2);
    assert_eq!(delta("get configmaps"), 1);
    assert_eq!(delta("list configmaps"), 1);
    assert_eq!(delta("create pods"), 1);
    assert_eq!(delta("patch pods/status"), 1);
}

/// The time the simulator's lock is held (what the benchmark reads as "the simulator's lock N% held")
/// grows with the requests it serves and never exceeds the real time they took: it counts each request
/// and watch read under the lock once, not once per nested step.
#[tokio::test]
async fn the_time_its_lock_is_held_grows_with_requests_and_stays_within_real_time() {
    let started = std::time::Instant::now();
    let (sim, client) = start().await;
    namespace(&client, "held").await;
    let api: Api<ConfigMap> = Api::namespaced(client, "held");
    let before = sim.lock_held();
    for i in 0..50 {
        api.create(&PostParams::default(), &cm(&format!("held-{i}"), &[]))
            .await
            .unwrap();
        api.get(&format!("held-{i}")).await.unwrap();
    }
    let after = sim.lock_held();
    let wall = started.elapsed();
    assert!(
        after > before,
        "100 requests held the lock for {after:?}, as long as before them"
    );
    assert!(
        after <= wall,
        "held {after:?} in {wall:?} of real time: counted more than once"
    );
}

/// Merge patches of one object sent at once, each adding its own annotation, all land: however the
/// server orders concurrent writes, none is lost to another: a patch made from a version that another
/// write has since replaced must not be stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_patches_of_one_object_all_land() {
    let (_sim, client) = start().await;
    namespace(&client, "concurrent").await;
    let api: Api<ConfigMap> = Api::namespaced(client, "concurrent");
    api.create(&PostParams::default(), &cm("shared", &[]))
        .await
        .unwrap();
    let patches = (0..40).map(|i| {
        let api = api.clone();
        async move {
            let patch = json!({"metadata": {"annotations": {format!("k{i}"): i.to_string()}}});
            api.patch("shared", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    });
    futures::future::join_all(patches).await;
    let annotations = api
        .get("shared")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap();
    for i in 0..40 {
        assert_eq!(
            annotations.get(&format!("k{i}")).map(String::as_str),
            Some(i.to_string().as_str()),
            "patch {i} lost: {annotations:?}"
        );
    }
}
