//! The applier against the simulator, through the real kube client: order, ownerReferences, redelivery,
//! conflicts, rollback after a failure half-way (W14), and which errors are retried.

use crate::common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject};
use volcano_runner::cluster::{
    Applier, ApplyError, ClusterError, ErrorClass, RetryPolicy, Role, Step,
};
use volcano_runner::sim::FaultRule;

fn applier(env: &Env) -> Applier {
    Applier::new(
        env.client.clone(),
        RetryPolicy::from_config(&env.config),
        FINGERPRINT,
    )
}

/// Namespace, baseline policy, job, and two companions. (Not a Service named `j-1`: Volcano's svc
/// plugin makes that one itself, owned by the job, and the applier would rightly adopt it.)
fn full_plan(ns: &str, fingerprint: &str) -> Vec<Step> {
    vec![
        namespace_step(ns),
        baseline_policy(ns),
        vcjob(ns, "j-1", fingerprint),
        service(ns, "j-1-web"),
        configmap(ns, "j-1-etc"),
    ]
}

fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_some()
}

/// A fresh plan is created object by object in plan order (resourceVersions increase along the plan),
/// the companions carry a controller ownerReference with the created job's uid, and the outcome lists
/// exactly the job's objects as created.
#[tokio::test]
async fn applies_in_order_with_owner_references() {
    let env = start().await;
    let outcome = applier(&env)
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();

    let ns: Api<Namespace> = Api::all(env.client.clone());
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client.clone(), "alice");
    let services: Api<Service> = Api::namespaced(env.client.clone(), "alice");
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), "alice");
    let job = jobs(&env.client, "alice").get("j-1").await.unwrap();
    let svc = services.get("j-1-web").await.unwrap();
    let cm = configmaps.get("j-1-etc").await.unwrap();
    // The job's own resourceVersion moves on as Volcano's controller updates it; the create response
    // (the outcome's primary) has the one it was created with.
    let order = [
        rv(&ns.get("alice").await.unwrap().metadata),
        rv(&policies.get("baseline").await.unwrap().metadata),
        rv(&outcome.primary),
        rv(&svc.metadata),
        rv(&cm.metadata),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "created out of order: {order:?}"
    );

    let uid = job.uid().unwrap();
    assert_eq!(outcome.primary.uid.as_deref(), Some(uid.as_str()));
    for (what, refs) in [
        ("service", svc.owner_references()),
        ("configmap", cm.owner_references()),
    ] {
        assert_eq!(refs.len(), 1, "{what}: {refs:?}");
        assert_eq!(refs[0].uid, uid, "{what}");
        assert_eq!(refs[0].kind, "Job");
        assert_eq!(refs[0].api_version, "batch.volcano.sh/v1alpha1");
        assert_eq!(refs[0].controller, Some(true));
    }
    assert!(!outcome.primary_existed);
    let created: Vec<String> = outcome.created.iter().map(ToString::to_string).collect();
    assert_eq!(
        created,
        [
            "Job alice/j-1",
            "Service alice/j-1-web",
            "ConfigMap alice/j-1-etc"
        ]
    );
    assert!(outcome.reused.is_empty());

    // Deleting the job takes the companions with it: the references are real.
    jobs(&env.client, "alice")
        .delete("j-1", &DeleteParams::background())
        .await
        .unwrap();
    assert!(!exists(&services, "j-1-web").await);
    assert!(!exists(&configmaps, "j-1-etc").await);
}

/// The same plan delivered again is recognised by its fingerprint: nothing new is created, the job is
/// the same object. A delivery after a partial apply (job there, companions missing) completes it.
#[tokio::test]
async fn redelivery_reuses_what_exists_and_completes_a_partial_apply() {
    let env = start().await;
    let applier = applier(&env);
    let first = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    let again = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    assert!(again.primary_existed);
    assert!(again.created.is_empty(), "{:?}", again.created);
    assert_eq!(again.reused.len(), 3);
    assert_eq!(again.primary.uid, first.primary.uid);

    // A job whose earlier attempt died after the VolcanoJob was created.
    let partial = [namespace_step("bob"), vcjob("bob", "j-1", "sha256:b")];
    let made = applier.apply(&partial).await.unwrap();
    // A new applier (another runner, empty namespace cache) completes it.
    let other = self::applier(&env);
    let done = other.apply(&full_plan("bob", "sha256:b")).await.unwrap();
    assert!(done.primary_existed);
    let created: Vec<String> = done.created.iter().map(ToString::to_string).collect();
    assert_eq!(created, ["Service bob/j-1-web", "ConfigMap bob/j-1-etc"]);
    let svc: Service = Api::namespaced(env.client.clone(), "bob")
        .get("j-1-web")
        .await
        .unwrap();
    assert_eq!(
        svc.owner_references()[0].uid,
        made.primary.uid.clone().unwrap()
    );
}

/// The same job id with different content is a conflict (the runner's `duplicate_job_id`), and the
/// existing job and its companions are left exactly as they were.
#[tokio::test]
async fn a_different_submission_with_the_same_id_is_a_conflict() {
    let env = start().await;
    let applier = applier(&env);
    let first = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    let mut second = full_plan("alice", "sha256:other");
    second.push(configmap("alice", "only-in-the-second"));
    let err = applier.apply(&second).await.unwrap_err();
    assert!(err.is_duplicate(), "{err}");
    assert_eq!(err.class(), ErrorClass::Permanent);
    let ApplyError::Conflict {
        object,
        role,
        existing,
        desired,
        rollback,
    } = &err
    else {
        panic!("expected a conflict, got {err:?}");
    };
    assert_eq!(object.to_string(), "Job alice/j-1");
    assert_eq!(*role, Role::Primary);
    assert_eq!(existing.as_deref(), Some("sha256:a"));
    assert_eq!(desired, "sha256:other");
    assert!(rollback.deleted.is_empty() && rollback.failed.is_empty());

    let job = jobs(&env.client, "alice").get("j-1").await.unwrap();
    assert_eq!(job.uid(), first.primary.uid);
    assert_eq!(job.annotations()[FINGERPRINT], "sha256:a");
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), "alice");
    assert!(exists(&configmaps, "j-1-etc").await);
    assert!(!exists(&configmaps, "only-in-the-second").await);
}

/// A companion name taken by an object that is not this job's is a conflict too, and this attempt's
/// job is removed again.
#[tokio::test]
async fn a_companion_name_taken_by_a_stranger_is_a_conflict() {
    let env = start().await;
    let applier = applier(&env);
    create_namespace(&env.client, "alice").await;
    let stranger = Step::from_value(
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "j-1-etc", "namespace": "alice"}}),
        Role::Companion,
    )
    .unwrap();
    Api::<DynamicObject>::namespaced_with(env.client.clone(), "alice", &stranger.resource)
        .create(&Default::default(), &stranger.object().unwrap())
        .await
        .unwrap();
    let err = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap_err();
    let ApplyError::Conflict {
        object,
        role,
        rollback,
        ..
    } = &err
    else {
        panic!("expected a conflict, got {err:?}");
    };
    assert_eq!(object.to_string(), "ConfigMap alice/j-1-etc");
    assert_eq!(*role, Role::Companion);
    let deleted: Vec<String> = rollback.deleted.iter().map(ToString::to_string).collect();
    assert_eq!(deleted, ["Service alice/j-1-web", "Job alice/j-1"]);
    assert!(!exists(&jobs(&env.client, "alice"), "j-1").await);
}

/// A step the cluster rejects half-way (an invalid ConfigMap name, 422) removes what this attempt
/// created, newest first; the namespace and the shared policy stay; the error is permanent and carries
/// the cluster's own message for the FAILURE event.
#[tokio::test]
async fn a_rejected_step_half_way_rolls_back_this_attempts_objects() {
    let env = start().await;
    let mut plan = full_plan("alice", "sha256:a");
    plan.push(configmap("alice", "Not_A_Valid_Name"));
    let err = applier(&env).apply(&plan).await.unwrap_err();

    assert_eq!(err.class(), ErrorClass::Permanent, "{err}");
    let ApplyError::Cluster {
        object,
        source,
        rollback,
    } = &err
    else {
        panic!("expected a cluster error, got {err:?}");
    };
    assert_eq!(object.name, "Not_A_Valid_Name");
    assert!(
        matches!(source, ClusterError::Rejected { code: 422, .. }),
        "{source:?}"
    );
    assert!(
        source.cluster_message().contains("Not_A_Valid_Name"),
        "{}",
        source.cluster_message()
    );
    let deleted: Vec<String> = rollback.deleted.iter().map(ToString::to_string).collect();
    assert_eq!(
        deleted,
        [
            "ConfigMap alice/j-1-etc",
            "Service alice/j-1-web",
            "Job alice/j-1"
        ]
    );
    assert!(rollback.failed.is_empty());

    assert!(!exists(&jobs(&env.client, "alice"), "j-1").await);
    assert!(
        !exists(
            &Api::<Service>::namespaced(env.client.clone(), "alice"),
            "j-1-web"
        )
        .await
    );
    assert!(
        !exists(
            &Api::<ConfigMap>::namespaced(env.client.clone(), "alice"),
            "j-1-etc"
        )
        .await
    );
    assert!(exists(&Api::<Namespace>::all(env.client.clone()), "alice").await);
    assert!(
        exists(
            &Api::<NetworkPolicy>::namespaced(env.client.clone(), "alice"),
            "baseline"
        )
        .await
    );
}

/// A transient failure half-way (every ConfigMap create answers 503) uses up the retry budget, rolls back
/// the job and its Service, and is retryable (the runner requeues). Once the cluster recovers, the next
/// attempt creates everything afresh.
#[tokio::test]
async fn a_transient_failure_half_way_rolls_back_and_stays_retryable() {
    // The simulator's 503s ask for Retry-After: 1 s, so a 2.5 s budget makes a few attempts.
    let env = start_with(|c| c.retry.max_elapsed = Duration::from_millis(2500)).await;
    let applier = applier(&env);
    env.sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "create".into(),
        error_503: 1.0,
        ..FaultRule::default()
    });
    let err = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let ApplyError::Cluster {
        source, rollback, ..
    } = &err
    else {
        panic!("expected a cluster error, got {err:?}");
    };
    assert!(
        matches!(source, ClusterError::GaveUp { attempts, .. } if *attempts > 1),
        "{source:?}"
    );
    let deleted: Vec<String> = rollback.deleted.iter().map(ToString::to_string).collect();
    assert_eq!(deleted, ["Service alice/j-1-web", "Job alice/j-1"]);
    assert!(!exists(&jobs(&env.client, "alice"), "j-1").await);

    env.sim.faults().clear();
    let outcome = applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    assert!(
        !outcome.primary_existed,
        "the rollback removed the first attempt's job"
    );
    assert_eq!(outcome.created.len(), 3);
}

/// A primary created with a finalizer of this attempt's (the runner's cleanup finalizer) is rolled back
/// for good: marked `volcano-runner/rolled-back`, the finalizer taken off, deleted, and gone at once
/// (before, it stayed, being deleted, and the next delivery took it for the submission's ended job). A
/// leftover of such a job whose delete did not happen is removed by the next attempt, which asks to be
/// tried again (retryable) instead of adopting it; the attempt after creates the job afresh.
#[tokio::test]
async fn a_rolled_back_job_goes_with_its_finalizer_and_a_leftover_is_not_adopted() {
    let env = start_with(|c| c.retry.max_elapsed = Duration::from_millis(2500)).await;
    let applier = applier(&env);
    let with_finalizer = |fingerprint: &str| {
        let mut plan = full_plan("alice", fingerprint);
        plan[2].metadata.finalizers = Some(vec!["ucloud.dk/cleanup".to_owned()]);
        plan
    };
    // Fails for a retry and leaves no job: `what` says why there is none.
    let retried_without_job = |what: &'static str| {
        let plan = with_finalizer("sha256:a");
        let applier = &applier;
        let env = &env;
        async move {
            let err = applier.apply(&plan).await.unwrap_err();
            assert!(err.is_retryable(), "{err}");
            assert!(!exists(&jobs(&env.client, "alice"), "j-1").await, "{what}");
        }
    };
    env.sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "create".into(),
        error_503: 1.0,
        ..FaultRule::default()
    });
    retried_without_job("gone, not held by the finalizer").await;

    // A leftover: marked, its finalizer off, not deleted (the delete failed).
    env.sim.faults().clear();
    let created = applier.apply(&with_finalizer("sha256:a")).await.unwrap();
    assert!(!created.primary_existed);
    let patch = serde_json::json!({"metadata": {
        "finalizers": [],
        "annotations": {volcano_runner::cluster::labels::ROLLED_BACK: "true"},
    }});
    jobs(&env.client, "alice")
        .patch(
            "j-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    retried_without_job("the leftover removed").await;
    let outcome = applier.apply(&with_finalizer("sha256:a")).await.unwrap();
    assert!(!outcome.primary_existed, "created afresh");
    let job = jobs(&env.client, "alice").get("j-1").await.unwrap();
    assert!(
        !job.annotations()
            .contains_key(volcano_runner::cluster::labels::ROLLED_BACK)
    );
}

/// A 503 window shorter than the budget is ridden out: the apply succeeds after the window.
#[tokio::test]
async fn retries_ride_through_a_503_window() {
    let env = start_with(|c| c.retry.max_elapsed = Duration::from_secs(10)).await;
    let window = Duration::from_millis(1500);
    let started = tokio::time::Instant::now();
    env.sim.faults().unavailable_for(window);
    let outcome = applier(&env)
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    assert!(started.elapsed() >= window, "succeeded inside the window?");
    assert_eq!(outcome.created.len(), 3);
    assert!(exists(&jobs(&env.client, "alice"), "j-1").await);
}

/// A server's Retry-After longer than the backoff is honoured: with 429s asking for 2 s and a backoff
/// of at most 200 ms, the successful attempt comes no sooner than 2 s after the first one.
#[tokio::test]
async fn retry_after_from_the_server_is_honoured() {
    let env = start_with(|c| c.retry.max_elapsed = Duration::from_secs(10)).await;
    env.sim.faults().add_rule(FaultRule {
        resource: "jobs".into(),
        verb: "create".into(),
        error_429: 1.0,
        retry_after_secs: 2,
        ..FaultRule::default()
    });
    let started = tokio::time::Instant::now();
    let faults_cleared = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.sim.faults().clear();
    };
    let applier = applier(&env);
    let plan = full_plan("alice", "sha256:a");
    let (outcome, ()) = tokio::join!(applier.apply(&plan), faults_cleared);
    outcome.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// An invalid job (422 from the CRD schema) and a webhook denial (400) are not retried: they come back
/// well before the first backoff delay would have ended, as permanent errors with the cluster's words.
#[tokio::test]
async fn rejections_are_not_retried() {
    let env = start_with(|c| {
        c.retry.min_delay = Duration::from_secs(2);
        c.retry.max_delay = Duration::from_secs(2);
        c.retry.max_elapsed = Duration::from_secs(10);
    })
    .await;
    let applier = applier(&env);
    let mut schema = vcjob_value("alice", "j-1", "sha256:a", &["sleep", "1"]);
    schema["spec"]["tasks"][0]["replicas"] = serde_json::json!("two");
    let mut webhook = vcjob_value("alice", "j-2", "sha256:b", &["sleep", "1"]);
    webhook["spec"]["minAvailable"] = serde_json::json!(5);
    for (job, code, words) in [
        (schema, 422, "must be of type integer"),
        (webhook, 400, "denied the request"),
    ] {
        let plan = [
            namespace_step("alice"),
            Step::from_value(job, Role::Primary).unwrap(),
        ];
        let started = tokio::time::Instant::now();
        let err = applier.apply(&plan).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "retried? {:?}",
            started.elapsed()
        );
        assert_eq!(err.class(), ErrorClass::Permanent, "{err}");
        let ApplyError::Cluster { source, .. } = &err else {
            panic!("expected a cluster error, got {err:?}");
        };
        assert!(
            matches!(source, ClusterError::Rejected { code: c, .. } if *c == code),
            "{source:?}"
        );
        assert!(
            source.cluster_message().contains(words),
            "{}",
            source.cluster_message()
        );
    }
}

/// A namespace deleted behind the runner's back: the cached applier's next attempt fails transiently
/// (not a FAILURE) and forgets the namespace; the attempt after that creates it again.
#[tokio::test]
async fn a_deleted_namespace_is_created_again_on_the_next_attempt() {
    let env = start().await;
    let applier = applier(&env);
    applier
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    Api::<Namespace>::all(env.client.clone())
        .delete("alice", &DeleteParams::default())
        .await
        .unwrap();
    // The job's pod needs its termination time before the namespace is gone.
    env.sim.advance(Duration::from_secs(30));
    assert!(
        !exists(&Api::<Namespace>::all(env.client.clone()), "alice").await,
        "the namespace is gone"
    );

    let plan = full_plan("alice", "sha256:a");
    let err = applier.apply(&plan).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let outcome = applier.apply(&plan).await.unwrap();
    assert_eq!(outcome.created.len(), 3);
    assert!(exists(&Api::<Namespace>::all(env.client.clone()), "alice").await);
    assert!(
        exists(
            &Api::<NetworkPolicy>::namespaced(env.client.clone(), "alice"),
            "baseline"
        )
        .await
    );
}

/// The first jobs of a new owner arrive together: one applier (shared, as a runner's handlers share it)
/// creates the owner's namespace and baseline policy once, not once per job.
#[tokio::test]
async fn concurrent_first_jobs_of_an_owner_create_its_namespace_once() {
    let env = start().await;
    let applier = std::sync::Arc::new(applier(&env));
    let before = env.sim.request_counts();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..16 {
        let applier = applier.clone();
        tasks.spawn(async move {
            let plan = vec![
                namespace_step("carol"),
                baseline_policy("carol"),
                vcjob("carol", &format!("j-{n}"), "sha256:c"),
            ];
            applier.apply(&plan).await.map(|_| ())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let after = env.sim.request_counts();
    let delta =
        |kind: &str| after.get(kind).copied().unwrap_or(0) - before.get(kind).copied().unwrap_or(0);
    assert_eq!(delta("create namespaces"), 1, "{after:?}");
    assert_eq!(
        delta("create networkpolicies.networking.k8s.io"),
        1,
        "{after:?}"
    );
    assert_eq!(delta("create jobs.batch.volcano.sh"), 16, "{after:?}");
}

/// The annotation that records a job's end (the pipeline's `<prefix>outcome`), as the runner configures
/// its applier.
const OUTCOME: &str = "ucloud.dk/outcome";

/// Ends the job as the monitor does: its end recorded on it, then its companions deleted (the job is
/// kept, its phase not ending yet: Volcano takes the terminate command in its own time).
async fn end_as_the_monitor_does(env: &Env, ns: &str) {
    jobs(&env.client, ns)
        .patch(
            "j-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!(
                {"metadata": {"annotations": {OUTCOME: "{\"state\":\"CANCELLED\"}"}}}
            )),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(env.client.clone(), ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns);
    for deleted in [
        services
            .delete("j-1-web", &DeleteParams::default())
            .await
            .err(),
        configmaps
            .delete("j-1-etc", &DeleteParams::default())
            .await
            .err(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            matches!(&deleted, kube::Error::Api(s) if s.code == 404),
            "{deleted}"
        );
    }
}

/// An ended job never regains a companion, whatever is redelivered and whoever was killed when (issue
/// 41, point 6):
/// - a redelivery that adopts the job (its first runner killed after the create) and creates its
///   companions slowly, while the job ends and its companions are deleted, removes what it created
///   after the end, and says the job has ended;
/// - a redelivery after the end, its phase not ending yet, creates nothing;
/// - a companion an earlier attempt's create left after the end (it landed late) goes with the next
///   redelivery.
///
/// On main each of the three left a companion owned by the kept job, for its whole retention.
#[tokio::test]
async fn an_ended_job_never_regains_a_companion() {
    let env = start().await;
    let marked = || applier(&env).with_end_marker(OUTCOME);
    let services: Api<Service> = Api::namespaced(env.client.clone(), "alice");
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), "alice");
    // The first runner created the job and was killed before its companions.
    let partial = [
        namespace_step("alice"),
        baseline_policy("alice"),
        vcjob("alice", "j-1", "sha256:a"),
    ];
    let first = marked().apply(&partial).await.unwrap();
    let uid = first.primary.uid.clone().unwrap();

    // The redelivery's creates are slow; the job ends while they are under way.
    env.sim.faults().add_rule(FaultRule {
        resource: "services".into(),
        verb: "create".into(),
        latency_ms: 1500,
        ..FaultRule::default()
    });
    let redelivery = tokio::spawn({
        let applier = marked();
        async move { applier.apply(&full_plan("alice", "sha256:a")).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    end_as_the_monitor_does(&env, "alice").await;
    let outcome = redelivery.await.unwrap().unwrap();
    env.sim.faults().clear();
    assert!(outcome.primary_existed);
    assert!(outcome.primary_ended, "{outcome:?}");
    assert!(!exists(&services, "j-1-web").await, "the Service came back");
    assert!(
        !exists(&configmaps, "j-1-etc").await,
        "the ConfigMap came back"
    );

    // Redelivered again after the end: nothing is created.
    let again = marked()
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    assert!(again.primary_ended && again.created.is_empty(), "{again:?}");
    assert!(!exists(&services, "j-1-web").await);
    assert!(!exists(&configmaps, "j-1-etc").await);

    // A create an earlier attempt sent before it was killed lands after the end: the next delivery
    // removes it.
    let late: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "j-1-etc", "namespace": "alice", "ownerReferences": [{
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "j-1",
            "uid": uid, "controller": true}]},
        "data": {"hostnames.txt": "j-1-job-0.j-1\n"}
    }))
    .unwrap();
    configmaps
        .create(&kube::api::PostParams::default(), &late)
        .await
        .unwrap();
    let swept = marked()
        .apply(&full_plan("alice", "sha256:a"))
        .await
        .unwrap();
    assert!(swept.primary_ended);
    assert!(
        !exists(&configmaps, "j-1-etc").await,
        "the late companion stays"
    );
    assert!(
        exists(&jobs(&env.client, "alice"), "j-1").await,
        "the job is kept"
    );
}
