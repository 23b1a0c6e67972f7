//! The Volcano model under the simulated clock, through the real kube client: the Appendix A job from
//! Pending to Completed (its PodGroup deleted then), gangs that do not fit, admission denials, image pull failures, exit codes and
//! policies, queues, deletion, and model output that passes the real CRD schemas.

use crate::sim_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use sim_support::*;
use volcano_runner::sim::registry::Registry;
use volcano_runner::sim::schema;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

async fn job_phase(client: &kube::Client, ns: &str, name: &str) -> String {
    phase(&jobs(client, ns).get(name).await.unwrap())
}

async fn the_podgroup(client: &kube::Client, ns: &str) -> DynamicObject {
    let list = podgroups(client, ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1, "one PodGroup");
    list.items.into_iter().next().unwrap()
}

#[tokio::test]
async fn appendix_a_job_runs_from_pending_to_completed() {
    let (sim, client) = start().await;
    namespace(&client, "app-kubernetes").await;
    let job = appendix_a_job(
        "j-42",
        "app-kubernetes",
        "ubuntu:22.04",
        &[
            "/bin/bash",
            "-c",
            "echo hello from j-42; sleep 30; echo bye",
        ],
    );
    jobs(&client, "app-kubernetes")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    let created_at = sim.now();

    // Right after creation: Pending, a PodGroup, the svc plugin's objects, a pod bound to a node but
    // still starting.
    let j = jobs(&client, "app-kubernetes").get("j-42").await.unwrap();
    assert_eq!(phase(&j), "Pending");
    assert_eq!(
        j.data["status"]["controlledResources"],
        json!({"plugin-env": "env", "plugin-svc": "svc"})
    );
    let pg = the_podgroup(&client, "app-kubernetes").await;
    assert_eq!(pg.name_any(), format!("j-42-{}", j.uid().unwrap()));
    assert_eq!(pg.data["spec"]["minMember"], 1);
    assert_eq!(pg.data["spec"]["queue"], "default");
    assert_eq!(
        pg.data["spec"]["minResources"]["cpu"], "2",
        "the init container's 100m is within the user job's 2 cpu"
    );
    let svc: Service = Api::namespaced(client.clone(), "app-kubernetes")
        .get("j-42")
        .await
        .unwrap();
    assert_eq!(
        svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    assert_eq!(
        svc.spec.as_ref().unwrap().selector.as_ref().unwrap()["volcano.sh/job-name"],
        "j-42"
    );
    assert_eq!(svc.owner_references()[0].uid, j.uid().unwrap());
    let cm: ConfigMap = Api::namespaced(client.clone(), "app-kubernetes")
        .get("j-42-svc")
        .await
        .unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data["job.host"], "j-42-job-0.j-42");
    assert_eq!(data["VC_JOB_HOSTS"], "j-42-job-0.j-42");
    assert_eq!(data["VC_JOB_NUM"], "1");
    let np: NetworkPolicy = Api::namespaced(client.clone(), "app-kubernetes")
        .get("j-42")
        .await
        .unwrap();
    assert_eq!(
        np.spec.unwrap().pod_selector.unwrap().match_labels.unwrap()["volcano.sh/job-name"],
        "j-42"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "app-kubernetes");
    let pod = pods.get("j-42-job-0").await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.node_name
            .as_deref()
            .is_some_and(|n| n.starts_with("sim-"))
    );
    assert_eq!(spec.hostname.as_deref(), Some("j-42-job-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("j-42"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"));
    assert_eq!(pod.labels()["volcano.sh/job-name"], "j-42");
    assert_eq!(pod.labels()["volcano.sh/task-spec"], "job");
    assert_eq!(
        pod.annotations()["scheduling.k8s.io/group-name"],
        pg.name_any()
    );
    let user = &spec.containers[0];
    let env: Vec<(String, Option<String>)> = user
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert!(env.contains(&("VC_TASK_INDEX".into(), Some("0".into()))));
    assert!(env.contains(&("VK_TASK_INDEX".into(), Some("0".into()))));
    assert!(env.iter().any(|(n, _)| n == "VC_JOB_HOSTS"));
    assert!(
        user.volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == "/etc/volcano" && m.name == "j-42-svc")
    );
    assert!(
        spec.init_containers.as_ref().unwrap()[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .any(|e| e.name == "VC_TASK_INDEX")
    );
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert!(
        pod.status.as_ref().unwrap().pod_ip.is_none(),
        "no IP before the sandbox starts"
    );

    // One simulated second later the containers run: the pod has an IP, the job is Running.
    sim.advance(secs(1));
    let pod = pods.get("j-42-job-0").await.unwrap();
    let st = pod.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    let ip = st.pod_ip.clone().unwrap();
    assert!(ip.starts_with("10.244."), "{ip}");
    assert!(st.host_ip.is_some());
    assert_eq!(
        st.init_container_statuses.unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        0
    );
    let j = jobs(&client, "app-kubernetes").get("j-42").await.unwrap();
    assert_eq!(phase(&j), "Running");
    assert_eq!(j.data["status"]["running"], 1);
    assert_eq!(
        j.data["status"]["taskStatusCount"]["job"]["phase"]["Running"],
        1
    );
    assert_eq!(
        the_podgroup(&client, "app-kubernetes").await.data["status"]["phase"],
        "Running"
    );
    let log = pods
        .logs("j-42-job-0", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(log, "hello from j-42\n", "the log holds what ran so far");

    // 29 s later it still runs; at 30 s the command ends and the job completes.
    sim.advance(secs(29));
    assert_eq!(
        job_phase(&client, "app-kubernetes", "j-42").await,
        "Running"
    );
    sim.advance(secs(1));
    let j = jobs(&client, "app-kubernetes").get("j-42").await.unwrap();
    assert_eq!(phase(&j), "Completed");
    assert_eq!(j.data["status"]["succeeded"], 1);
    assert_eq!(j.data["status"]["runningDuration"], "30s");
    let conditions: Vec<&str> = j.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(conditions, vec!["Pending", "Running", "Completed"]);
    let pod = pods.get("j-42-job-0").await.unwrap();
    let st = pod.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(term.exit_code, 0);
    assert_eq!(term.reason.as_deref(), Some("Completed"));
    let started = term.started_at.unwrap().0;
    let finished = term.finished_at.unwrap().0;
    assert_eq!(finished.duration_since(started).as_secs(), 30);
    assert_eq!(started.duration_since(created_at).as_secs(), 1);
    assert_eq!(
        pods.logs("j-42-job-0", &LogParams::default())
            .await
            .unwrap(),
        "hello from j-42\nbye\n"
    );
    // Volcano's killJob deletes an ended job's PodGroup.
    let groups = podgroups(&client, "app-kubernetes")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(groups.items.is_empty(), "the PodGroup goes with the end");
}

#[tokio::test]
async fn a_job_bigger_than_any_node_stays_pending_and_unschedulable() {
    let (sim, client) = start().await;
    namespace(&client, "big").await;
    // 20 cpu fits the cluster (5 x 16) but no node (16): enqueued, pods made, none can be bound.
    let job = gang_job("wide", "big", 1, "20", &["sleep", "10"]);
    jobs(&client, "big")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(secs(120));
    assert_eq!(job_phase(&client, "big", "wide").await, "Pending");
    let pg = the_podgroup(&client, "big").await;
    assert_eq!(pg.data["status"]["phase"], "Inqueue");
    let cond = pg.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Unschedulable")
        .expect("Unschedulable condition")
        .clone();
    assert_eq!(cond["reason"], "NotEnoughResources");
    assert_eq!(
        cond["message"],
        "1/1 tasks in gang unschedulable: pod group is not ready, 1 Pending, 1 minAvailable; Pending: 1 Unschedulable. Origin reason is wide-job-0: 0/5 nodes are unavailable: 5 Insufficient cpu."
    );
    let pod: Pod = Api::namespaced(client.clone(), "big")
        .get("wide-job-0")
        .await
        .unwrap();
    assert!(pod.spec.unwrap().node_name.is_none());
    let sched = pod
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (sched.status.as_str(), sched.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    // The job carries the controller's warning.
    let events: Api<Event> = Api::namespaced(client.clone(), "big");
    let ev = events
        .list(&ListParams::default().fields("involvedObject.kind=Job,reason=PodGroupPending"))
        .await
        .unwrap();
    assert_eq!(ev.items.len(), 1);
    assert!(
        ev.items[0]
            .message
            .as_deref()
            .unwrap()
            .contains("tasks in gang unschedulable")
    );

    // A gang bigger than the whole cluster is not even enqueued.
    let huge = gang_job("huge", "big", 10, "16", &["sleep", "10"]);
    jobs(&client, "big")
        .create(&PostParams::default(), &dynamic(huge))
        .await
        .unwrap();
    sim.advance(secs(60));
    assert_eq!(job_phase(&client, "big", "huge").await, "Pending");
    let pgs = podgroups(&client, "big")
        .list(&ListParams::default())
        .await
        .unwrap();
    let pg = pgs
        .items
        .iter()
        .find(|p| p.name_any().starts_with("huge-"))
        .unwrap();
    assert_eq!(pg.data["status"]["phase"], "Pending");
    let msg = pg.data["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        msg.starts_with(
            "10/0 tasks in gang unschedulable: pod group is not ready, 10 minAvailable"
        ),
        "{msg}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "big");
    assert!(
        pods.list(&ListParams::default().labels("volcano.sh/job-name=huge"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn gangs_wait_their_turn_and_run_when_capacity_frees() {
    let (sim, client) = start().await;
    namespace(&client, "gang").await;
    let api = jobs(&client, "gang");
    // 5 pods of 12 cpu fill the 5 nodes; the second gang of 2 x 12 must wait for the first.
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("first", "gang", 5, "12", &["sleep", "100"])),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("second", "gang", 2, "12", &["sleep", "10"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "gang", "first").await, "Running");
    assert_eq!(job_phase(&client, "gang", "second").await, "Pending");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "gang");
    let first_pods = pods
        .list(&ListParams::default().labels("volcano.sh/job-name=first"))
        .await
        .unwrap();
    let nodes: std::collections::BTreeSet<String> = first_pods
        .items
        .iter()
        .map(|p| p.spec.clone().unwrap().node_name.unwrap())
        .collect();
    assert_eq!(nodes.len(), 5, "spread over the five nodes");
    let second = pods
        .list(&ListParams::default().labels("volcano.sh/job-name=second"))
        .await
        .unwrap();
    assert!(
        second
            .items
            .iter()
            .all(|p| p.spec.clone().unwrap().node_name.is_none()),
        "no part of the gang is bound"
    );
    sim.advance(secs(99));
    assert_eq!(job_phase(&client, "gang", "first").await, "Running");
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "gang", "first").await, "Completed");
    let second = pods
        .list(&ListParams::default().labels("volcano.sh/job-name=second"))
        .await
        .unwrap();
    assert!(
        second
            .items
            .iter()
            .all(|p| p.spec.clone().unwrap().node_name.is_some()),
        "the whole gang is bound at once"
    );
    sim.advance(secs(11));
    assert_eq!(job_phase(&client, "gang", "second").await, "Completed");

    // Node capacity shows in the Node objects.
    let node: Node = Api::all(client.clone()).get("sim-gpu-1").await.unwrap();
    let alloc = node.status.unwrap().allocatable.unwrap();
    assert_eq!(alloc["cpu"].0, "16");
    assert_eq!(alloc["memory"].0, "64Gi");
    assert_eq!(alloc["nvidia.com/gpu"].0, "4");
}

#[tokio::test]
async fn a_wrong_field_type_is_rejected_with_the_crd_message() {
    let (_sim, client) = start().await;
    namespace(&client, "types").await;
    let mut job = appendix_a_job("j-1", "types", "ubuntu:22.04", &["sleep", "1"]);
    job["spec"]["tasks"][0]["replicas"] = json!("string");
    let err = jobs(&client, "types")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 422);
    assert_eq!(
        status(&err).message,
        "Job.batch.volcano.sh \"j-1\" is invalid: spec.tasks[0].replicas: Invalid value: \"string\": spec.tasks[0].replicas in body must be of type integer: \"string\""
    );
}

#[tokio::test]
async fn admission_denials_read_like_volcano() {
    let (sim, client) = start().await;
    namespace(&client, "adm").await;
    let api = jobs(&client, "adm");
    let mut too_many = gang_job("j-1", "adm", 2, "1", &["sleep", "1"]);
    too_many["spec"]["minAvailable"] = json!(3);
    let err = api
        .create(&PostParams::default(), &dynamic(too_many))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400);
    assert_eq!(
        status(&err).message,
        "admission webhook \"validatejob.volcano.sh\" denied the request: job 'minAvailable' should not be greater than total replicas in tasks;"
    );

    let mut no_queue = gang_job("j-2", "adm", 1, "1", &["sleep", "1"]);
    no_queue["spec"]["queue"] = json!("research");
    let err = api
        .create(&PostParams::default(), &dynamic(no_queue.clone()))
        .await
        .unwrap_err();
    assert!(
        status(&err).message.ends_with(
            "unable to find job queue: queues.scheduling.volcano.sh \"research\" not found;"
        ),
        "{}",
        status(&err).message
    );

    // Create the queue: it opens; close it: jobs are refused the way Volcano refuses them.
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &queue());
    queues.create(&PostParams::default(), &dynamic(json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"}, "spec": {"weight": 1}}))).await.unwrap();
    assert_eq!(
        queues.get("research").await.unwrap().data["status"]["state"],
        "Open"
    );
    api.create(&PostParams::default(), &dynamic(no_queue))
        .await
        .unwrap();
    sim.set_queue_state("research", "Closed").unwrap();
    assert_eq!(
        queues.get("research").await.unwrap().data["status"]["state"],
        "Closing",
        "it still holds a job"
    );
    let mut later = gang_job("j-3", "adm", 1, "1", &["sleep", "1"]);
    later["spec"]["queue"] = json!("research");
    let err = api
        .create(&PostParams::default(), &dynamic(later))
        .await
        .unwrap_err();
    assert!(
        status(&err).message.ends_with(
            "can only submit job to queue with state `Open`, queue `research` status is `Closing`;"
        ),
        "{}",
        status(&err).message
    );
    sim.advance(secs(5));
    api.delete("j-2", &DeleteParams::default()).await.unwrap();
    sim.advance(secs(5));
    assert_eq!(
        queues.get("research").await.unwrap().data["status"]["state"],
        "Closed"
    );
    // Reopened through the status subresource, as a queue controller would.
    queues
        .patch_status(
            "research",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "Open"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        queues.get("research").await.unwrap().data["status"]["state"],
        "Open"
    );

    let mut dup = gang_job("j-4", "adm", 1, "1", &["sleep", "1"]);
    let t = dup["spec"]["tasks"][0].clone();
    dup["spec"]["tasks"].as_array_mut().unwrap().push(t);
    let err = api
        .create(&PostParams::default(), &dynamic(dup))
        .await
        .unwrap_err();
    assert!(status(&err).message.ends_with("duplicated task name job;"));

    // Updates may only scale; annotations are fine.
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("j-5", "adm", 1, "1", &["sleep", "100"])),
    )
    .await
    .unwrap();
    merge(
        &api,
        "j-5",
        json!({"metadata": {"annotations": {"ucloud.dk/expiry": "42"}}}),
    )
    .await
    .unwrap();
    let err = merge(&api, "j-5", json!({"spec": {"queue": "research"}}))
        .await
        .unwrap_err();
    assert!(
        status(&err)
            .message
            .contains("job updates may not change fields other than")
    );
}

#[tokio::test]
async fn image_pull_failure_shows_err_image_pull_then_backoff() {
    let (sim, client) = start().await;
    namespace(&client, "pull").await;
    let job = appendix_a_job(
        "j-7",
        "pull",
        "registry.example.com/does-not-exist:1",
        &["sleep", "5"],
    );
    jobs(&client, "pull")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "pull");
    sim.advance(secs(1));
    let waiting = |p: &Pod| {
        let cs = p.status.clone().unwrap().container_statuses.unwrap();
        let w = cs[0].state.clone().unwrap().waiting.unwrap();
        (w.reason.unwrap(), w.message.unwrap_or_default())
    };
    let pod = pods.get("j-7-job-0").await.unwrap();
    let (reason, message) = waiting(&pod);
    assert_eq!(reason, "ErrImagePull");
    assert!(
        message.contains("registry.example.com/does-not-exist:1"),
        "{message}"
    );
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));
    sim.advance(secs(10));
    let (reason, _) = waiting(&pods.get("j-7-job-0").await.unwrap());
    assert_eq!(reason, "ImagePullBackOff");
    sim.advance(secs(600));
    assert_eq!(job_phase(&client, "pull", "j-7").await, "Pending");
    let err = pods
        .logs("j-7-job-0", &LogParams::default())
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400);
    assert!(
        status(&err)
            .message
            .contains("is waiting to start: trying and failing to pull image")
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "pull");
    let failed = events
        .list(&ListParams::default().fields("reason=Failed"))
        .await
        .unwrap();
    assert!(failed.items.iter().any(|e| {
        e.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Failed to pull image \"registry.example.com/does-not-exist:1\"")
    }));
}

#[tokio::test]
async fn exit_codes_fail_jobs_and_policies_pick_the_action() {
    let (sim, client) = start().await;
    namespace(&client, "exit").await;
    let api = jobs(&client, "exit");
    api.create(
        &PostParams::default(),
        &dynamic(gang_job(
            "bad",
            "exit",
            1,
            "1",
            &["sh", "-c", "sleep 3; exit 3"],
        )),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("falsy", "exit", 1, "1", &["false"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "exit", "falsy").await, "Failed");
    sim.advance(secs(3));
    let j = api.get("bad").await.unwrap();
    assert_eq!(phase(&j), "Failed");
    assert_eq!(j.data["status"]["failed"], 1);
    let pod: Pod = Api::namespaced(client.clone(), "exit")
        .get("bad-job-0")
        .await
        .unwrap();
    let term = pod.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((term.exit_code, term.reason.as_deref()), (3, Some("Error")));

    // A RestartJob policy restarts the whole gang until maxRetry runs out.
    let mut retried = gang_job("retried", "exit", 2, "1", &["sh", "-c", "sleep 2; exit 1"]);
    retried["spec"]["maxRetry"] = json!(2);
    retried["spec"]["policies"] = json!([{"event": "PodFailed", "action": "RestartJob"}]);
    api.create(&PostParams::default(), &dynamic(retried))
        .await
        .unwrap();
    sim.advance(secs(3));
    let j = api.get("retried").await.unwrap();
    assert_eq!(phase(&j), "Restarting");
    assert_eq!(j.data["status"]["retryCount"], 1);
    sim.advance(secs(1));
    let j = api.get("retried").await.unwrap();
    assert_eq!(
        phase(&j),
        "Pending",
        "the old pods are gone, new ones are starting"
    );
    assert_eq!(j.data["status"]["version"], 1);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "exit");
    let fresh = pods
        .list(&ListParams::default().labels("volcano.sh/job-name=retried"))
        .await
        .unwrap();
    assert_eq!(fresh.items.len(), 2);
    assert!(
        fresh
            .items
            .iter()
            .all(|p| p.annotations()["volcano.sh/job-version"] == "1")
    );
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "exit", "retried").await, "Running");
    sim.advance(secs(10));
    let j = api.get("retried").await.unwrap();
    assert_eq!(phase(&j), "Failed");
    assert_eq!(j.data["status"]["retryCount"], 2);

    // An exit-code policy can complete a job instead.
    let mut done = gang_job("done", "exit", 1, "1", &["sh", "-c", "sleep 1; exit 42"]);
    done["spec"]["policies"] = json!([{"exitCode": 42, "action": "CompleteJob"}]);
    api.create(&PostParams::default(), &dynamic(done))
        .await
        .unwrap();
    sim.advance(secs(3));
    assert_eq!(job_phase(&client, "exit", "done").await, "Completed");
}

#[tokio::test]
async fn deleting_a_job_terminates_its_pods_and_frees_capacity() {
    let (sim, client) = start().await;
    namespace(&client, "del").await;
    let api = jobs(&client, "del");
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("hog", "del", 5, "16", &["sleep", "infinity"])),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("next", "del", 1, "4", &["sleep", "5"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "del", "hog").await, "Running");
    assert_eq!(job_phase(&client, "del", "next").await, "Pending");

    // Foreground: the job shows Terminating with its pods still there, then both are gone.
    let d = api
        .delete("hog", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(d.is_left());
    let j = api.get("hog").await.unwrap();
    assert!(j.metadata.deletion_timestamp.is_some());
    assert_eq!(phase(&j), "Terminating");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "del");
    let hog = pods
        .list(&ListParams::default().labels("volcano.sh/job-name=hog"))
        .await
        .unwrap();
    assert_eq!(hog.items.len(), 5);
    assert!(
        hog.items
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some())
    );
    sim.advance(secs(1));
    assert!(
        pods.list(&ListParams::default().labels("volcano.sh/job-name=hog"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(code(&api.get("hog").await.unwrap_err()), 404);
    let svc: Api<Service> = Api::namespaced(client.clone(), "del");
    assert!(
        svc.get_opt("hog").await.unwrap().is_none(),
        "the svc plugin's objects went with it"
    );
    assert!(
        podgroups(&client, "del")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|p| !p.name_any().starts_with("hog-"))
    );
    // The freed capacity went to the waiting job.
    assert_eq!(job_phase(&client, "del", "next").await, "Pending");
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "del", "next").await, "Running");
}

#[tokio::test]
async fn node_selectors_taints_and_gpus() {
    let (sim, client) = start().await;
    namespace(&client, "gpu").await;
    let mut job = gang_job("train", "gpu", 1, "4", &["sleep", "10"]);
    job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
        json!("2");
    jobs(&client, "gpu")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    let mut too_many = gang_job("greedy", "gpu", 1, "4", &["sleep", "10"]);
    too_many["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] =
        json!("3");
    jobs(&client, "gpu")
        .create(&PostParams::default(), &dynamic(too_many))
        .await
        .unwrap();
    sim.advance(secs(1));
    let pod: Pod = Api::namespaced(client.clone(), "gpu")
        .get("train-job-0")
        .await
        .unwrap();
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("sim-gpu-1"));
    assert_eq!(
        job_phase(&client, "gpu", "greedy").await,
        "Pending",
        "only 2 of 4 GPUs are left"
    );
    sim.advance(secs(10));
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "gpu", "greedy").await, "Running");

    // A taint keeps pods without a toleration off a node.
    let nodes: Api<Node> = Api::all(client.clone());
    for n in [
        "sim-node-1",
        "sim-node-2",
        "sim-node-3",
        "sim-node-4",
        "sim-gpu-1",
    ] {
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "sducloud", "value": "apps", "effect": "NoSchedule"}]}}))).await.unwrap();
    }
    let untolerating: Pod = serde_json::from_value(json!({"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "5"]}]}})).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "gpu");
    pods.create(&PostParams::default(), &untolerating)
        .await
        .unwrap();
    let p = pods.get("bare").await.unwrap();
    assert!(p.spec.unwrap().node_name.is_none());
    let cond = p
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        cond.message.as_deref(),
        Some("0/5 nodes are unavailable: 5 node(s) had untolerated taint {sducloud: apps}.")
    );
    // Appendix A's toleration lets it through.
    let job = appendix_a_job("j-9", "gpu", "ubuntu:22.04", &["sleep", "5"]);
    jobs(&client, "gpu")
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "gpu", "j-9").await, "Running");
}

/// A pod's tolerations may be added to after its creation, never changed nor taken away (the real API
/// server's pod update validation), and a pod kept off every node by a `NoSchedule` taint is placed once
/// a toleration is added: `Equal` (key, value, effect) and `Exists` (key) both count.
#[tokio::test]
async fn tolerations_are_only_added_and_a_pod_that_tolerates_the_taints_is_placed() {
    let (sim, client) = start().await;
    namespace(&client, "tol").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let taints = json!({"spec": {"taints": [
        {"key": "ucloud.dk/maintenance-w1", "value": "w1", "effect": "NoSchedule"},
        {"key": "other", "value": "x", "effect": "NoSchedule"}
    ]}});
    for n in nodes.list(&ListParams::default()).await.unwrap().items {
        nodes
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&taints),
            )
            .await
            .unwrap();
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "waits"}, "spec": {
        "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "50"]}],
        "tolerations": [{"key": "other", "operator": "Exists"}]
    }}))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "tol");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    sim.advance(secs(1));
    let bound = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(bound(&pods.get("waits").await.unwrap()), None);
    // Taken away, or changed: refused, and the pod is as it was.
    for tolerations in [
        json!([]),
        json!([{"key": "other", "operator": "Equal", "value": "x"}]),
    ] {
        let patch = json!({"spec": {"tolerations": tolerations}});
        let err = pods
            .patch("waits", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect_err("a toleration may not be removed or changed");
        let kube::Error::Api(status) = err else {
            panic!("not an API error: {err}");
        };
        assert_eq!(status.code, 422, "{}", status.message);
        assert!(
            status
                .message
                .contains("existing toleration can not be modified"),
            "{}",
            status.message
        );
    }
    assert_eq!(
        pods.get("waits").await.unwrap().spec.unwrap().tolerations,
        pod.spec.clone().unwrap().tolerations
    );
    // Added to: accepted, and the pod is placed.
    let patch = json!({"spec": {"tolerations": [
        {"key": "other", "operator": "Exists"},
        {"key": "ucloud.dk/maintenance-w1", "operator": "Equal", "value": "w1", "effect": "NoSchedule"}
    ]}});
    pods.patch("waits", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("a toleration may be added");
    sim.advance(secs(1));
    assert!(bound(&pods.get("waits").await.unwrap()).is_some());
}

#[tokio::test]
async fn model_objects_pass_the_real_crd_schemas() {
    let (sim, client) = start().await;
    namespace(&client, "schema").await;
    let api = jobs(&client, "schema");
    api.create(
        &PostParams::default(),
        &dynamic(appendix_a_job(
            "j-1",
            "schema",
            "ubuntu:22.04",
            &["sleep", "5"],
        )),
    )
    .await
    .unwrap();
    api.create(
        &PostParams::default(),
        &dynamic(gang_job("j-2", "schema", 2, "20", &["sleep", "5"])),
    )
    .await
    .unwrap();
    sim.advance(secs(1));
    let mut docs: Vec<(&str, Value)> = Vec::new();
    docs.push((
        "jobs",
        serde_json::to_value(api.get("j-1").await.unwrap()).unwrap(),
    ));
    docs.push((
        "jobs",
        serde_json::to_value(api.get("j-2").await.unwrap()).unwrap(),
    ));
    for pg in podgroups(&client, "schema")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        docs.push(("podgroups", serde_json::to_value(pg).unwrap()));
    }
    for q in Api::<DynamicObject>::all_with(client.clone(), &queue())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        docs.push(("queues", serde_json::to_value(q).unwrap()));
    }
    sim.advance(secs(5));
    docs.push((
        "jobs",
        serde_json::to_value(api.get("j-1").await.unwrap()).unwrap(),
    ));
    let registry = Registry::with_volcano();
    for (plural, doc) in docs {
        let group = if plural == "jobs" {
            "batch.volcano.sh"
        } else {
            "scheduling.volcano.sh"
        };
        let version = if plural == "jobs" {
            "v1alpha1"
        } else {
            "v1beta1"
        };
        let t = registry.get(registry.lookup(group, version, plural).unwrap());
        let mut copy = doc.clone();
        let out = schema::apply(t.schema.as_ref().unwrap(), &mut copy);
        assert!(out.errors.is_empty(), "{plural}: {:?}", out.errors);
        assert!(
            out.unknown.is_empty(),
            "{plural}: fields the real schema would prune: {:?}",
            out.unknown
        );
        assert!(doc.pointer("/status").is_some(), "{plural} has a status");
    }
}

/// A machine lost and back: deleting its Node removes the pods bound to it at once (the pod garbage
/// collector), Volcano restarts the gang (`PodEvicted` → `RestartJob`), which cannot fit on the nodes
/// left, and a Node created again under that name (the restarted machine registering) takes pods again.
#[tokio::test]
async fn a_lost_node_takes_its_pods_with_it_and_takes_pods_again_when_it_comes_back() {
    let (sim, client) = start().await;
    namespace(&client, "lost").await;
    let api = jobs(&client, "lost");
    let mut hog = gang_job("hog", "lost", 5, "16", &["sleep", "infinity"]);
    hog["spec"]["policies"] = json!([{"event": "PodEvicted", "action": "RestartJob"}]);
    api.create(&PostParams::default(), &dynamic(hog))
        .await
        .unwrap();
    sim.advance(secs(1));
    assert_eq!(job_phase(&client, "lost", "hog").await, "Running");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "lost");
    let bound_to = |node: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| p.name_any())
                .collect::<Vec<_>>()
        }
    };
    let victim = bound_to("sim-node-2").await;
    assert_eq!(victim.len(), 1, "one rank per node");
    let nodes: Api<Node> = Api::all(client.clone());
    let saved = nodes.get("sim-node-2").await.unwrap();
    nodes
        .delete("sim-node-2", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        pods.get_opt(&victim[0]).await.unwrap().is_none(),
        "the pod went with its node"
    );
    sim.advance(secs(5));
    let retries = api.get("hog").await.unwrap().data["status"]["retryCount"].clone();
    assert_eq!(retries, json!(1), "Volcano restarted the job");
    assert_eq!(job_phase(&client, "lost", "hog").await, "Pending");
    let pg = the_podgroup(&client, "lost").await;
    let said = serde_json::to_string(&pg.data["status"]).unwrap();
    assert!(
        said.contains("insufficient cpu"),
        "the four nodes left cannot hold the gang: {said}"
    );

    // The machine is back: the gang fits again, with a rank on it.
    let mut back = saved.clone();
    back.metadata.resource_version = None;
    back.metadata.uid = None;
    back.metadata.creation_timestamp = None;
    nodes.create(&PostParams::default(), &back).await.unwrap();
    sim.advance(secs(5));
    assert_eq!(job_phase(&client, "lost", "hog").await, "Running");
    assert_eq!(bound_to("sim-node-2").await.len(), 1);
}

/// When a job finishes, Volcano's job controller kills it and the svc plugin's `OnJobDelete` deletes the
/// job's Service, NetworkPolicy and hosts ConfigMap: an ended job kept for its TTL is kept without them.
/// And the phase a failed rank leaves, as docs/monitor.md says: `Terminated` under a `PodFailed`
/// `TerminateJob` policy (the runner's default), `Failed` without a policy, `Completed` for a success.
#[tokio::test]
async fn a_finished_job_loses_its_svc_plugin_objects_and_ends_in_the_phase_its_policy_gives() {
    let (sim, client) = start().await;
    namespace(&client, "fin").await;
    let api = jobs(&client, "fin");
    let mut terminated = gang_job("term", "fin", 2, "1", &["sh", "-c", "sleep 2; exit 3"]);
    terminated["spec"]["policies"] = json!([{"event": "PodFailed", "action": "TerminateJob"}]);
    for job in [
        terminated,
        gang_job("plain", "fin", 1, "1", &["sh", "-c", "sleep 2; exit 3"]),
        gang_job("ok", "fin", 1, "1", &["sh", "-c", "sleep 2"]),
        gang_job("long", "fin", 1, "1", &["sh", "-c", "sleep 600"]),
    ] {
        api.create(&PostParams::default(), &dynamic(job))
            .await
            .unwrap();
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "fin");
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), "fin");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "fin");
    sim.advance(secs(1));
    for name in ["term", "plain", "ok", "long"] {
        assert!(services.get_opt(name).await.unwrap().is_some(), "{name}");
        assert!(policies.get_opt(name).await.unwrap().is_some(), "{name}");
        assert!(
            maps.get_opt(&format!("{name}-svc"))
                .await
                .unwrap()
                .is_some(),
            "{name}"
        );
    }
    for _ in 0..10 {
        sim.advance(secs(1));
    }
    for (name, want) in [
        ("term", "Terminated"),
        ("plain", "Failed"),
        ("ok", "Completed"),
    ] {
        let job = api.get(name).await.unwrap();
        assert_eq!(phase(&job), want, "{name}");
        assert!(
            services.get_opt(name).await.unwrap().is_none(),
            "{name}'s Service"
        );
        assert!(
            policies.get_opt(name).await.unwrap().is_none(),
            "{name}'s NetworkPolicy"
        );
        assert!(
            maps.get_opt(&format!("{name}-svc"))
                .await
                .unwrap()
                .is_none(),
            "{name}'s ConfigMap"
        );
        assert_eq!(
            job.data["status"]["controlledResources"],
            json!({"plugin-env": "env"}),
            "{name}"
        );
    }
    // A job still running keeps them.
    assert_eq!(job_phase(&client, "fin", "long").await, "Running");
    assert!(services.get_opt("long").await.unwrap().is_some());
    assert!(policies.get_opt("long").await.unwrap().is_some());
}
