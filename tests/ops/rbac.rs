//! The RBAC in deploy/base is checked against reality: a runner (consumers, leases and monitor) runs a
//! scripted session against the simulator with every Kubernetes request recorded, and the test fails on a
//! request the Role and ClusterRole do not grant, and on a grant that no request used.

use crate::ops_common;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use volcano_runner::messages::v1::JobState;
use volcano_runner::ops::Ops;
use volcano_runner::ops::kube::{ApiCall, ResourceCall};
use volcano_runner::ops::rbac::Permissions;

use ops_common::fleet::{Fleet, sleeping_job};
use ops_common::*;

/// The Role and ClusterRole of the rendered base, for the runner's namespace.
fn deployed_permissions(namespace: &str) -> Permissions {
    let objects = render("base");
    let role: Role = strict(all(&objects, "Role")[0]).unwrap();
    let cluster_role: ClusterRole = strict(all(&objects, "ClusterRole")[0]).unwrap();
    Permissions {
        namespace: namespace.to_owned(),
        role: role.rules.unwrap_or_default(),
        cluster_role: cluster_role.rules.unwrap_or_default(),
    }
}

/// Distinct calls, without object names (RBAC here grants by resource, not by name).
fn distinct(calls: &[volcano_runner::ops::kube::RecordedCall]) -> BTreeSet<ResourceCall> {
    calls
        .iter()
        .filter_map(|c| match &c.call {
            ApiCall::Resource(r) => Some(ResourceCall {
                name: None,
                ..r.clone()
            }),
            ApiCall::NonResource { .. } => None,
        })
        .collect()
}

/// Whether the recorder saw `verb` on `resource` (metric form, e.g. `configmaps`), in `namespace`
/// (`Some("")`: any namespace other than the runner's; `None`: cluster-scoped or all namespaces).
fn saw(fleet: &Fleet, verb: &str, resource: &str, in_runner_namespace: bool) -> bool {
    let runner_ns = fleet.config.cluster.namespace.clone();
    distinct(&fleet.recorder.calls()).iter().any(|c| {
        c.verb == verb
            && c.metric_resource() == resource
            && (c.namespace.as_deref() == Some(runner_ns.as_str())) == in_runner_namespace
    })
}

/// The scripted session: every path of the runner and the monitor that calls the API, including the rare
/// ones (a duplicate delivery, a rollback after a failed companion, a tombstone replaced after it expired,
/// a sweep), then the audit against the rendered Role and ClusterRole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rbac_grants_exactly_what_the_runner_uses() {
    use volcano_runner::sim::FaultRule;

    // Small steps until a job runs (so it does not end before the test looks), big ones after.
    let small = Some(Duration::from_secs(1));
    let step = Some(Duration::from_secs(20));
    let mut fleet = Fleet::start("rbac", Ops::new(), |c| {
        c.cluster.tombstone_ttl = Duration::from_secs(1);
    })
    .await;

    // A job that runs to its end, extended on the way, and delivered twice.
    fleet
        .submit(&sleeping_job(
            "rbac-1",
            300,
            Some(Duration::from_secs(3600)),
        ))
        .await;
    fleet.wait_state("rbac-1", JobState::Queued, None).await;
    fleet.wait_state("rbac-1", JobState::Running, small).await;
    fleet
        .submit(&sleeping_job(
            "rbac-1",
            300,
            Some(Duration::from_secs(3600)),
        ))
        .await;
    fleet
        .wait_until("the duplicate's QUEUED again", |f| {
            f.count("rbac-1/QUEUED") >= 2
        })
        .await;
    fleet
        .extend("rbac-1", "ext-1", Duration::from_secs(600))
        .await;
    fleet
        .wait_for("the extension", None, |e| {
            e.message_id.as_deref() == Some("rbac-1/extend/ext-1")
        })
        .await;
    fleet.wait_state("rbac-1", JobState::Success, step).await;

    // A job that fails: its terminal event carries the log tails (a successful job's does not).
    let mut failing = serde_json::to_value(sleeping_job("rbac-8", 30, None)).unwrap();
    failing["application"]["invocation"] = serde_json::json!([
        {"word": {"word": "sh"}}, {"word": {"word": "-c"}},
        {"word": {"word": "echo computing; sleep 30; exit 3"}}
    ]);
    fleet
        .submit(&serde_json::from_value(failing).unwrap())
        .await;
    fleet.wait_state("rbac-8", JobState::Running, small).await;
    fleet.wait_state("rbac-8", JobState::Failure, step).await;

    // A job that outlives its time allocation, and one cancelled while it runs.
    fleet
        .submit(&sleeping_job("rbac-2", 3600, Some(Duration::from_secs(60))))
        .await;
    fleet.wait_state("rbac-2", JobState::Running, small).await;
    fleet.wait_state("rbac-2", JobState::Expired, step).await;
    // An interactive one (a terminal): it goes to the interactive queue, which the runner declares.
    let mut terminal = serde_json::to_value(sleeping_job("rbac-3", 3600, None)).unwrap();
    terminal["application"]["applicationType"] = "APPLICATION_TYPE_TERMINAL".into();
    fleet
        .submit(&serde_json::from_value(terminal).unwrap())
        .await;
    fleet.wait_state("rbac-3", JobState::Running, small).await;
    fleet.cancel("rbac-3").await;
    fleet.wait_state("rbac-3", JobState::Cancelled, step).await;

    // The peer of the next jobs: running, as a peer must be (one that has ended is refused).
    fleet.submit(&sleeping_job("rbac-peer", 3600, None)).await;
    fleet
        .wait_state("rbac-peer", JobState::Running, small)
        .await;

    // A job whose last companion (the Service for its peer) cannot be created: the applier rolls back
    // what it created. (What happens to the job after that is the runner tests' business.)
    fleet.sim.faults().add_rule(FaultRule {
        resource: "services".into(),
        verb: "create".into(),
        error_500: 1.0,
        ..FaultRule::default()
    });
    let mut peered = sleeping_job("rbac-5", 3600, None);
    peered.resources.push(
        serde_json::from_value(
            serde_json::json!({"peer": {"hostname": "db", "jobId": "rbac-peer"}}),
        )
        .unwrap(),
    );
    fleet.submit(&peered).await;
    // (The job's deletion shows the rollback: ended jobs are terminated, never deleted, and the
    // companions of the jobs that ended above were deleted already.)
    fleet
        .wait_until("a rollback", |f| {
            saw(f, "delete", "jobs.batch.volcano.sh", false)
        })
        .await;
    fleet.sim.faults().clear();

    // A job with a peer (its Service companion), delivered twice: the redelivery goes through the apply
    // again and reads each companion that answers AlreadyExists.
    let mut peered = sleeping_job("rbac-7", 3600, None);
    peered.resources.push(
        serde_json::from_value(
            serde_json::json!({"peer": {"hostname": "db", "jobId": "rbac-peer"}}),
        )
        .unwrap(),
    );
    fleet.submit(&peered).await;
    fleet.wait_state("rbac-7", JobState::Queued, None).await;
    fleet.submit(&peered).await;
    fleet
        .wait_until("the duplicate's QUEUED again", |f| {
            f.count("rbac-7/QUEUED") >= 2
        })
        .await;
    // Its peer runs: the monitor writes the peer's address (creates the EndpointSlice), reads each pod and
    // removes its gate; the job runs.
    fleet.wait_state("rbac-7", JobState::Running, small).await;
    // The peer restarts on another address (its pod evicted): the job's peer endpoint is rewritten.
    let peer_namespace = distinct(&fleet.recorder.calls())
        .into_iter()
        .find(|c| c.verb == "create" && c.resource == "endpointslices")
        .and_then(|c| c.namespace)
        .expect("the peers' EndpointSlice was created");
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(fleet.admin.clone(), &peer_namespace)
        .evict("j-rbac-peer-job-0", &kube::api::EvictParams::default())
        .await
        .expect("the peer's pod is evicted");
    for _ in 0..100 {
        if saw(&fleet, "patch", "endpointslices.discovery.k8s.io", false) {
            break;
        }
        fleet.sim.advance(Duration::from_secs(1));
        fleet.collect(Duration::from_millis(100)).await;
    }
    fleet
        .wait_until("the peer's endpoint rewritten", |f| {
            saw(f, "patch", "endpointslices.discovery.k8s.io", false)
        })
        .await;
    // The job with a peer is cancelled: a TerminateJob command ends it, and at its end its companions
    // (the peers Service, its own policy, the peers' EndpointSlice) are found by their label and deleted.
    fleet.cancel("rbac-7").await;
    fleet.wait_state("rbac-7", JobState::Cancelled, step).await;
    fleet
        .wait_until("the companions deleted at the end", |f| {
            saw(f, "delete", "endpointslices.discovery.k8s.io", false)
                && saw(f, "delete", "services", false)
        })
        .await;

    // A submission whose VolcanoJob name is taken by an object the runner did not make (no managed-by
    // label, so the runner's lookup misses it): the create answers AlreadyExists and the runner reads
    // the object to compare fingerprints, as it does when two runners race on one submission.
    let job_namespace = distinct(&fleet.recorder.calls())
        .into_iter()
        .find(|c| c.verb == "create" && c.resource == "jobs")
        .and_then(|c| c.namespace)
        .expect("a job namespace");
    let foreign: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j-rbac-6", "namespace": job_namespace},
        "spec": {"minAvailable": 1, "schedulerName": "volcano", "queue": "default",
            "tasks": [{"name": "job", "replicas": 1, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}}]}
    }))
    .unwrap();
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"),
        "jobs",
    );
    kube::Api::<kube::api::DynamicObject>::namespaced_with(
        fleet.admin.clone(),
        &job_namespace,
        &resource,
    )
    .create(&kube::api::PostParams::default(), &foreign)
    .await
    .expect("a VolcanoJob the runner did not make");
    fleet.submit(&sleeping_job("rbac-6", 60, None)).await;
    fleet.wait_state("rbac-6", JobState::Failure, None).await;

    // A cancel that overtakes its submit leaves a tombstone; cancelled again after the tombstone
    // expired, the tombstone is replaced.
    fleet.cancel("rbac-4").await;
    fleet
        .wait_until("CANCELLED of the job without a job", |f| {
            f.count("rbac-4/CANCELLED") >= 1
        })
        .await;
    // Tombstones age on the runner's clock, the monitor's: the simulator's here, which the test moves.
    fleet.sim.advance(Duration::from_millis(1500));
    fleet.cancel("rbac-4").await;
    fleet
        .wait_until("the tombstone replaced", |f| {
            saw(f, "update", "configmaps", true)
        })
        .await;

    // A maintenance window (far ahead: no job here is held or warned) has its taint put on the nodes.
    let windows = volcano_runner::cluster::MaintenanceWindows::new(
        fleet.admin.clone(),
        &fleet.config.cluster,
    );
    let now = fleet.sim.now();
    let window = volcano_runner::cluster::Window::new(
        now + jiff::SignedDuration::from_hours(24 * 30),
        now + jiff::SignedDuration::from_hours(24 * 30 + 1),
        BTreeSet::new(),
        None,
        "rbac@test",
        now,
    )
    .expect("a window");
    assert!(windows.schedule(&window).await.expect("stored"));
    fleet
        .wait_until("the window's taint written", |f| {
            saw(f, "patch", "nodes", false)
        })
        .await;
    assert!(windows.cancel(&window.id).await.expect("cancelled"));

    // A new runner process sweeps the expired tombstone when it starts.
    fleet.sim.advance(Duration::from_millis(1500));
    fleet.restart(|_| {}).await;
    fleet
        .wait_until("the sweep", |f| saw(f, "delete", "configmaps", true))
        .await;

    // An owner namespace whose baseline was written before sealed jobs existed (selecting every pod): the
    // new runner, meeting it on its first job there, reads it and gives it the runner's pod selector.
    kube::Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        fleet.admin.clone(),
        &job_namespace,
    )
    .patch(
        "ucloud-baseline",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({"spec": {"podSelector": {"matchExpressions": null}}}),
        ),
    )
    .await
    .expect("the baseline as an older runner wrote it");
    fleet.submit(&sleeping_job("rbac-9", 60, None)).await;
    fleet.wait_state("rbac-9", JobState::Queued, None).await;
    assert!(saw(
        &fleet,
        "patch",
        "networkpolicies.networking.k8s.io",
        false
    ));
    fleet.stop().await;

    let calls = distinct(&fleet.recorder.calls());
    let listing: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c.verb,
                c.metric_resource(),
                c.namespace.as_deref().unwrap_or("(cluster)")
            )
        })
        .collect();
    let permissions = deployed_permissions(&fleet.config.cluster.namespace);
    let audit = permissions.audit(&calls);
    assert!(
        audit.is_exact(),
        "the deployed RBAC does not match what the runner does:\n{audit}\nrecorded:\n{}",
        listing.join("\n")
    );
}

/// The audit can fail both ways: a rule taken away leaves calls ungranted, a rule added is unused.
#[test]
fn the_audit_notices_a_missing_and_an_extra_grant() {
    let mut permissions = deployed_permissions("volcano-runner");
    let lease_call = ResourceCall {
        verb: "update",
        group: "coordination.k8s.io".into(),
        resource: "leases".into(),
        subresource: None,
        namespace: Some("volcano-runner".into()),
        name: None,
    };
    assert!(permissions.grants(&lease_call));
    permissions.role.retain(|r| {
        !r.resources
            .as_ref()
            .is_some_and(|rs| rs.contains(&"leases".to_owned()))
    });
    let audit = permissions.audit([&lease_call]);
    assert_eq!(audit.denied.len(), 1);
    assert!(
        !audit.unused.is_empty(),
        "everything else is unused by this one call"
    );
}

/// `[monitor] reserve_nodes` (on in the base, acting for jobs with a waiting time) patches nodes, with the grant the base ClusterRole gives
/// for the maintenance windows' taints (exercised by the audited session).
#[test]
fn the_base_grants_the_node_patch_of_the_taints() {
    let patch = ResourceCall {
        verb: "patch",
        group: String::new(),
        resource: "nodes".into(),
        subresource: None,
        namespace: None,
        name: Some("node-1".into()),
    };
    let permissions = deployed_permissions("volcano-runner");
    assert!(permissions.grants(&patch), "the base grants the node patch");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/clusterrole.yaml"
    ))
    .unwrap();
    assert!(
        text.contains("reserve_nodes = true") && text.contains("maintenance=<window id>"),
        "the ClusterRole says what the node patch is for"
    );
}
