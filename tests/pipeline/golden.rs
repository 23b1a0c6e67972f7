//! Golden tests of the pipeline: one test per case of section 5 of the UCloud reference
//! (`ucloud-app-kubernetes.md`), named after the case; `_changed` marks where issue 4 deliberately changes
//! UCloud's behaviour. Inputs are SubmitJob files in `tests/golden/cases/`, expected output the `.yaml`
//! next to them (regenerate with `UPDATE_GOLDEN=1 cargo test --test pipeline golden::`, then review the
//! diff). Each test also asserts the facts the reference states, so a blindly regenerated golden still
//! fails when behaviour drifts. Every rendered VolcanoJob is checked against the real CRD schema and
//! Volcano's admission rules (`pipeline_support::assert_cluster_accepts`).
//!
//! Cases 20–24 are mostly the runner's and the monitor's (lifecycle texts, cancel, reconciliation, the
//! pause switch); their tests here cover the pipeline's share of them (case 23 the monitor's decision
//! for a job that vanished, which is pure), and each name says what its test asserts.

use crate::pipeline_support;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use pipeline_support::*;
use serde_json::{Value, json};
use volcano_runner::messages::v1::{
    JobState as EventState, ProxyAction, parameter_value, resource_value,
};
use volcano_runner::monitor::{Settings, decide};
use volcano_runner::pipeline::config::BandwidthCaps;
use volcano_runner::pipeline::hooks::{self, HookPlan, Outbound, TerminationCause};
use volcano_runner::pipeline::plugins::expiry::{self, Extension};
use volcano_runner::pipeline::plugins::multi_node;
use volcano_runner::pipeline::{DesiredJob, NamespaceMode, names};
use volcano_runner::volcano::{JobCondition, JobPhase, JobState, JobStatus, VolcanoJob};

fn case(name: &str) -> volcano_runner::messages::v1::SubmitJob {
    job(&format!("cases/{name}"))
}

fn check(name: &str, actual: Value) {
    golden(&format!("cases/{name}"), &actual);
}

/// The rendered VolcanoJob as the API server returns it, in `phase` since `since`.
fn observed(desired: &DesiredJob, phase: JobPhase, since: Timestamp) -> VolcanoJob {
    let mut job = desired.vcjob.clone();
    job.metadata.uid = Some("uid-1".into());
    job.metadata.resource_version = Some("100".into());
    job.status = Some(JobStatus {
        state: JobState {
            phase: phase.clone(),
            reason: None,
            message: None,
            last_transition_time: Some(Time(since)),
        },
        conditions: vec![JobCondition {
            status: phase,
            last_transition_time: Some(Time(since)),
        }],
        ..JobStatus::default()
    });
    job
}

/// What the job looks like after the monitor applied `plan`'s patch.
fn patched(job: &VolcanoJob, plan: &HookPlan) -> VolcanoJob {
    let mut job = job.clone();
    let annotations = job
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for key in &plan.remove {
        annotations.remove(key);
    }
    annotations.extend(plan.set.clone());
    let rv: u64 = job
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap();
    job.metadata.resource_version = Some((rv + 1).to_string());
    job
}

fn pod(job_id: &str, rank: u32, ip: &str, started: Timestamp, finished: Option<Timestamp>) -> Pod {
    let state = match finished {
        Some(end) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                started_at: Some(Time(started)),
                finished_at: Some(Time(end)),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        },
        None => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(started)),
            }),
            ..ContainerState::default()
        },
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(names::pod_name(job_id, rank)),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(
                if finished.is_some() {
                    "Failed"
                } else {
                    "Running"
                }
                .into(),
            ),
            pod_ip: Some(ip.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: names::USER_CONTAINER.into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Case 1: `j-<id>` in the configured namespace, task `job`, so pods are `j-42-job-<rank>`.
#[test]
fn case_01_names() {
    let desired = render(&case("case_01_names"), &reference());
    let job = vcjob_json(&desired);
    assert_eq!(job["apiVersion"], "batch.volcano.sh/v1alpha1");
    assert_eq!(job["kind"], "Job");
    assert_eq!(job["metadata"]["name"], "j-42");
    assert_eq!(job["metadata"]["namespace"], "app-kubernetes");
    assert_eq!(job["spec"]["tasks"][0]["name"], "job");
    assert_eq!(names::pod_name("42", 0), "j-42-job-0");
    assert!(
        desired.namespace.is_none(),
        "single mode declares no namespace"
    );
    check(
        "case_01_names",
        json!({
            "apiVersion": job["apiVersion"], "kind": job["kind"],
            "name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"],
            "task": job["spec"]["tasks"][0]["name"],
            "container": at(&job, "/spec/tasks/0/template/spec/containers/0/name"),
        }),
    );
}

/// Case 31 (new, not in UCloud): whole nodes. Each rank alone on its node through a required pod
/// anti-affinity on the host name against any Volcano job's pod in any namespace (its own other ranks
/// included); the choice is recorded on the job and labelled on its pods; the product's resources stay.
/// The job records what one whole node is charged (`[pipeline.whole_nodes]` by category), and a product
/// the operator has not priced whole nodes for is refused, naming the field.
#[test]
fn case_31_exclusive_nodes_new() {
    let mut job = case("case_31_exclusive_nodes_new");
    let desired = render(&job, &reference());
    let rendered = vcjob_json(&desired);
    let pod = &rendered["spec"]["tasks"][0]["template"];
    let term = &pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["namespaceSelector"], json!({}), "every namespace");
    assert_eq!(
        term["labelSelector"],
        json!({"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]})
    );
    assert_eq!(
        rendered["metadata"]["annotations"]["ucloud.dk/exclusiveNodes"],
        "true"
    );
    assert_eq!(
        pod["metadata"]["labels"]["ucloud.dk/exclusiveNodes"],
        "true"
    );
    assert_eq!(
        rendered["metadata"]["annotations"]["ucloud.dk/reservable"],
        "true"
    );
    // Besides the configured tolerations, it tolerates its own job's node reservation only
    // (`[monitor] reserve_nodes`).
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{"key": "sducloud", "operator": "Equal", "value": "apps", "effect": "NoSchedule"},
               {"key": "ucloud.dk/reserved", "operator": "Equal",
                "value": job.job_id, "effect": "NoSchedule"}])
    );
    assert_eq!(
        at(
            &rendered,
            "/spec/tasks/0/template/spec/containers/0/resources"
        ),
        &json!({"requests": {"cpu": "64000m", "memory": "393216Mi"}}),
        "requests as the product and no CPU or memory limit: the node's all"
    );
    let charge = &rendered["metadata"]["annotations"]["ucloud.dk/wholeNodeCharge"];
    assert_eq!(
        serde_json::from_str::<Value>(charge.as_str().expect("a charge")).unwrap(),
        json!({"product": "u1-fat-node", "cpu": 128, "memoryGib": 1024, "gpu": 0}),
        "the reference configuration's charge for category u1-fat"
    );
    let mut unpriced = job.clone();
    unpriced.product.as_mut().unwrap().category = "u1-thin".into();
    let refused = volcano_runner::pipeline::render(&unpriced, &reference(), now())
        .expect_err("no whole-node charge for u1-thin");
    assert_eq!(refused.field(), "exclusiveNodes");
    assert!(
        refused
            .message()
            .contains("whole nodes are not offered for product u1-fat-64"),
        "{refused}"
    );
    // Its ticks charge the whole node (not the product's 64 vCPU and 384 GiB) and say so.
    let tick_of = |desired: &DesiredJob| {
        let start = ts("2024-05-01T12:01:00Z");
        let running = observed(desired, JobPhase::Running, start);
        let on_start = hooks::on_start(&reference(), &running, &[], start).unwrap();
        let started = patched(&running, &on_start);
        let plan =
            hooks::on_monitoring(&reference(), &started, &[], ts("2024-05-01T12:02:30Z")).unwrap();
        let ticks: Vec<_> = plan
            .publish
            .into_iter()
            .filter_map(|o| match o {
                Outbound::Accounting(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(ticks.len(), 1, "{ticks:?}");
        let t = &ticks[0];
        (
            t.product_id.clone(),
            t.cpu,
            t.memory_gib,
            t.gpu,
            t.replicas,
            t.exclusive_nodes,
        )
    };
    assert_eq!(
        tick_of(&desired),
        ("u1-fat-node".to_owned(), 128, 1024, 0, 3, true)
    );
    check(
        "case_31_exclusive_nodes_new",
        json!({
            "charge": charge,
            "affinity": pod["spec"]["affinity"],
            "podLabel": pod["metadata"]["labels"]["ucloud.dk/exclusiveNodes"],
            "annotation": rendered["metadata"]["annotations"]["ucloud.dk/exclusiveNodes"],
            "resources": at(&rendered, "/spec/tasks/0/template/spec/containers/0/resources"),
        }),
    );
    // Without the flag, nothing of it: the product is charged.
    job.exclusive_nodes = false;
    let plain_desired = render(&job, &reference());
    assert_eq!(
        tick_of(&plain_desired),
        ("u1-fat-64".to_owned(), 64, 384, 0, 3, false)
    );
    let plain = vcjob_json(&plain_desired);
    assert!(
        plain["spec"]["tasks"][0]["template"]["spec"]
            .get("affinity")
            .is_none()
    );
    assert!(
        plain["metadata"]["annotations"]
            .get("ucloud.dk/exclusiveNodes")
            .is_none()
    );
    assert!(
        plain["metadata"]["annotations"]
            .get("ucloud.dk/wholeNodeCharge")
            .is_none()
    );
}

/// Case 2 (changed): gang of 3, scheduler volcano, queue default; unlike UCloud, policies are set on
/// purpose (a failed pod ends the job, an eviction restarts it) and maxRetry is explicit (Volcano turns 0
/// into 3).
#[test]
fn case_02_gang_spec_policies_changed() {
    let desired = render(&case("case_02_gang_spec_policies_changed"), &reference());
    let mut spec = vcjob_json(&desired)["spec"].clone();
    let task = spec["tasks"][0].clone();
    assert_eq!(spec["schedulerName"], "volcano");
    assert_eq!(spec["minAvailable"], 3);
    assert_eq!(spec["queue"], "default");
    assert_eq!(spec["maxRetry"], 3);
    assert_eq!(
        spec["policies"],
        json!([
            {"event": "PodFailed", "action": "TerminateJob"},
            {"event": "PodEvicted", "action": "RestartJob"}
        ])
    );
    assert!(spec["plugins"]["env"].is_array() && spec["plugins"]["svc"].is_array());
    assert_eq!(task["replicas"], 3);
    assert_eq!(task["template"]["metadata"]["name"], "job-42");
    assert_eq!(spec["tasks"].as_array().unwrap().len(), 1);
    spec["tasks"] = json!([{"name": task["name"], "replicas": task["replicas"], "templateName": task["template"]["metadata"]["name"]}]);
    check("case_02_gang_spec_policies_changed", spec);
}

/// Case 3 (changed): requests equal limits, cpu in millicores; memory in `Mi` (as UCloud's final
/// version); `nvidia.com/gpu` only when the product has GPUs (UCloud wrote `"0"`); no resources at all for
/// a product with none.
#[test]
fn case_03_resources_gpu_zero_omitted_changed() {
    let config = reference();
    let mut job = case("case_03_resources_gpu_zero_omitted_changed");
    let gpu = user_container(&render(&job, &config))["resources"].clone();
    let expected = json!({"cpu": "4000m", "memory": "16384Mi", "nvidia.com/gpu": "1"});
    assert_eq!(gpu["limits"], expected);
    assert_eq!(gpu["requests"], expected);

    job.product.as_mut().unwrap().gpu = 0;
    let no_gpu = user_container(&render(&job, &config))["resources"].clone();
    assert_eq!(
        no_gpu["limits"],
        json!({"cpu": "4000m", "memory": "16384Mi"})
    );

    let product = job.product.as_mut().unwrap();
    (product.cpu, product.memory_gib) = (0, 0);
    let none = user_container(&render(&job, &config));
    assert!(none.get("resources").is_none(), "{none}");
    check(
        "case_03_resources_gpu_zero_omitted_changed",
        json!({"gpu1": gpu, "gpu0": no_gpu, "none": Value::Null}),
    );
}

/// Case 4: the tool's image, pulled if not present.
#[test]
fn case_04_image() {
    let container = user_container(&render(&case("case_04_image"), &reference()));
    assert_eq!(container["image"], "ubuntu:20.04");
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    check(
        "case_04_image",
        json!({"image": container["image"], "imagePullPolicy": container["imagePullPolicy"]}),
    );
}

/// Case 5: the configured toleration; none without configuration; the node selector by category.
#[test]
fn case_05_toleration_and_node_selector() {
    let job = case("case_05_toleration_and_node_selector");
    let with = pod_spec(&render(&job, &reference()));
    assert_eq!(
        with["tolerations"],
        json!([{"effect": "NoSchedule", "key": "sducloud", "operator": "Equal", "value": "apps"}])
    );
    assert!(with.get("nodeSelector").is_none());

    let mut config = defaults();
    let without = pod_spec(&render(&job, &config));
    assert!(without.get("tolerations").is_none());

    config.pipeline.scheduling.node_selector_label = Some("ucloud.dk/machine".into());
    let by_category = pod_spec(&render(&job, &config))["nodeSelector"].clone();
    assert_eq!(by_category, json!({"ucloud.dk/machine": "u1-standard"}));
    config
        .pipeline
        .scheduling
        .node_selector_by_category
        .insert("u1-standard".into(), "standard-node".into());
    let mapped = pod_spec(&render(&job, &config))["nodeSelector"].clone();
    assert_eq!(mapped, json!({"ucloud.dk/machine": "standard-node"}));
    check(
        "case_05_toleration_and_node_selector",
        json!({"tolerations": with["tolerations"], "nodeSelector": by_category, "mappedNodeSelector": mapped}),
    );
}

/// Case 6: `/dev/shm` memory-backed, sized to the product's memory; 1 GiB without.
#[test]
fn case_06_shared_memory() {
    let mut job = case("case_06_shared_memory");
    let spec = pod_spec(&render(&job, &reference()));
    let shm = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shm")
        .unwrap()
        .clone();
    assert_eq!(
        shm["emptyDir"],
        json!({"medium": "Memory", "sizeLimit": "16Gi"})
    );
    let mounts = spec["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "shm" && m["mountPath"] == "/dev/shm")
    );

    job.product.as_mut().unwrap().memory_gib = 0;
    let spec = pod_spec(&render(&job, &reference()));
    let small = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shm")
        .unwrap()
        .clone();
    assert_eq!(small["emptyDir"]["sizeLimit"], "1Gi");
    check(
        "case_06_shared_memory",
        json!({"memory16": shm, "noMemory": small}),
    );
}

/// Case 7 (changed): every job gets `/etc/ucloud`. Hostnames are deterministic, so a pinned, POSIX-sh init
/// container with limits writes every file from its own environment and the rank from `VC_TASK_INDEX`,
/// once (no ConfigMap: no API request for it). The script is run here with a real `sh` to check the files
/// each rank of a 1-, 2- and 5-replica job sees, including `cores.txt` and `job_id.txt` (W29), against
/// what the plugin documents ([`multi_node::static_files`]).
#[test]
fn case_07_multinode_scaffolding_configmap_changed() {
    let desired = render(
        &case("case_07_multinode_scaffolding_configmap_changed"),
        &reference(),
    );
    let spec = pod_spec(&desired);
    let init = spec["initContainers"][0].clone();
    assert_eq!(init["name"], "ucloud-compat");
    assert_eq!(init["image"], "docker.io/library/busybox:1.36.1");
    assert_eq!(init["command"][0], "/bin/sh");
    assert_eq!(
        init["resources"]["limits"],
        json!({"cpu": "50m", "memory": "16Mi"})
    );
    assert!(
        spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "ucloud-multinode"
                && m["mountPath"] == "/etc/ucloud"
                && m["readOnly"] == false)
    );
    assert!(
        objects_json(&desired)
            .iter()
            .all(|o| o["kind"] != "ConfigMap"),
        "no ConfigMap per job"
    );

    // Run the script as each pod would, with the volume as a temporary directory.
    let script = init["command"][2].as_str().unwrap().to_owned();
    let dir = std::env::temp_dir().join(format!("ucloud-multinode-{}", std::process::id()));
    let run = |env: &[(String, String)], rank: Option<&str>| {
        let out = dir.join(format!("out-{}", rank.unwrap_or("none")));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(script.replace("/etc/ucloud", out.to_str().unwrap()))
            .env_remove("VC_TASK_INDEX")
            .envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(rank) = rank {
            cmd.env("VC_TASK_INDEX", rank);
        }
        (cmd.output().unwrap(), out)
    };
    let env_of = |init: &Value| -> Vec<(String, String)> {
        init["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let (output, out) = run(&env_of(&init), Some("1"));
    assert!(output.status.success(), "{output:?}");
    let read = |out: &std::path::Path, f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    assert_eq!(read(&out, "rank.txt"), "1\n");
    assert_eq!(read(&out, "number_of_nodes.txt"), "2\n");
    assert_eq!(
        read(&out, "nodes.txt"),
        "j-42-job-0.j-42\nj-42-job-1.j-42\n"
    );
    assert_eq!(read(&out, "node-0.txt"), "j-42-job-0.j-42\n");
    assert_eq!(read(&out, "node-1.txt"), "j-42-job-1.j-42\n");
    assert_eq!(read(&out, "cores.txt"), "4\n");
    assert_eq!(read(&out, "job_id.txt"), "42\n");
    // Other shapes: every file is exactly what the plugin documents, and nothing else is written.
    for (job_id, replicas, cores) in [("7", 1u32, 1u32), ("a-b-c", 5, 16)] {
        let env = multi_node::init_env(job_id, replicas, cores);
        let env: Vec<(String, String)> = env
            .into_iter()
            .map(|e| (e.name, e.value.unwrap()))
            .collect();
        let rank = (replicas - 1).to_string();
        let (output, out) = run(&env, Some(&rank));
        assert!(output.status.success(), "{output:?}");
        let mut expected = multi_node::static_files(job_id, replicas, cores);
        expected.insert("rank.txt".to_owned(), format!("{rank}\n"));
        let mut written = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&out).unwrap() {
            let path = entry.unwrap().path();
            written.insert(
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            );
        }
        assert_eq!(written, expected, "{job_id} x{replicas}");
    }
    // Without the index the init container fails (the job fails) instead of spinning.
    let (missing, _) = run(&env_of(&init), None);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("VC_TASK_INDEX"));
    std::fs::remove_dir_all(&dir).unwrap();

    let volumes: Vec<Value> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"].as_str().unwrap().starts_with("ucloud-multinode"))
        .cloned()
        .collect();
    check(
        "case_07_multinode_scaffolding_configmap_changed",
        json!({"initContainer": init, "volumes": volumes}),
    );
}

/// Case 8 (changed: hardened): restartPolicy Never, no service account token, workingDir `/work` unless
/// turned off, non-root unless runAsRoot; additionally no service links, seccomp RuntimeDefault for
/// every pod, and all capabilities dropped for non-root applications. A runAsRoot application keeps the
/// runtime's default capabilities (no `capabilities` key), so `apt-get`, `chown` and `su` work.
#[test]
fn case_08_pod_hygiene_hardened_changed() {
    let mut job = case("case_08_pod_hygiene_hardened_changed");
    let spec = pod_spec(&render(&job, &reference()));
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let user = spec["containers"][0].clone();
    assert_eq!(user["workingDir"], "/work");
    assert_eq!(
        user["securityContext"],
        json!({"runAsNonRoot": true, "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
    );

    job.application.as_mut().unwrap().container =
        Some(volcano_runner::messages::v1::ContainerOptions {
            change_working_directory: Some(false),
            run_as_root: Some(true),
            run_as_real_user: None,
        });
    let root_spec = pod_spec(&render(&job, &reference()));
    let root = root_spec["containers"][0].clone();
    assert!(root.get("workingDir").is_none());
    assert_eq!(
        root["securityContext"],
        json!({"runAsNonRoot": false, "allowPrivilegeEscalation": true})
    );
    assert_eq!(
        root_spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    check(
        "case_08_pod_hygiene_hardened_changed",
        json!({
            "pod": {"restartPolicy": spec["restartPolicy"], "automountServiceAccountToken": spec["automountServiceAccountToken"],
                    "enableServiceLinks": spec["enableServiceLinks"], "securityContext": spec["securityContext"]},
            "default": {"workingDir": user["workingDir"], "securityContext": user["securityContext"]},
            "runAsRoot": {"workingDir": root.get("workingDir"), "securityContext": root["securityContext"]},
        }),
    );
}

/// Case 9: the argv replaces the entrypoint, two elements, nothing quoted.
#[test]
fn case_09_command() {
    let container = user_container(&render(&case("case_09_command"), &reference()));
    assert_eq!(container["command"], json!(["figlet", "Hello, World!"]));
    assert!(container.get("args").is_none());
    check("case_09_command", json!({"command": container["command"]}));
}

/// Case 10: the worked affix example; a `var` whose variables all lack values yields nothing, not even
/// its global prefix.
#[test]
fn case_10_affixes() {
    let container = user_container(&render(&case("case_10_affixes"), &reference()));
    assert_eq!(
        container["command"],
        json!([
            "prog",
            "--entries",
            "--entry",
            "42--next",
            "--entry",
            "hello--next",
            "--endOfEntries"
        ])
    );
    check("case_10_affixes", json!({"command": container["command"]}));
}

/// Case 11: a flag when true (trimmed, one argument), nothing when false or absent, an error naming the
/// parameter when the value is not a boolean.
#[test]
fn case_11_flags() {
    let config = reference();
    let mut job = case("case_11_flags");
    let on = user_container(&render(&job, &config))["command"].clone();
    assert_eq!(on, json!(["prog", "--verbose"]));
    job.parameters.get_mut("v").unwrap().value = Some(parameter_value::Value::Boolean(false));
    let off = user_container(&render(&job, &config))["command"].clone();
    assert_eq!(off, json!(["prog"]));
    job.parameters.clear();
    let absent = user_container(&render(&job, &config))["command"].clone();
    assert_eq!(absent, json!(["prog"]));
    job.parameters.insert(
        "v".into(),
        volcano_runner::messages::v1::ParameterValue {
            value: Some(parameter_value::Value::Text("yes".into())),
        },
    );
    let err = render_err(&job, &config);
    assert_eq!(err.field(), "parameters.v");
    check(
        "case_11_flags",
        json!({"true": on, "false": off, "absent": absent, "text": err.to_string()}),
    );
}

/// Case 12 (changed): booleans honour the parameter's trueValue/falseValue (W23; UCloud ignored them after
/// 2020) and fall back to `true`/`false`; enumerations map the option name to its value; an unknown option
/// is refused instead of passed through; floats are plain decimals.
#[test]
fn case_12_booleans_use_true_false_values_and_unknown_option_rejected_changed() {
    let name = "case_12_booleans_use_true_false_values_and_unknown_option_rejected_changed";
    let mut job = case(name);
    let command = user_container(&render(&job, &reference()))["command"].clone();
    assert_eq!(
        command,
        json!(["prog", "--gpu=no", "true", "-O3", "0.5", "10000000000.0"])
    );
    job.parameters.get_mut("opt").unwrap().value =
        Some(parameter_value::Value::Enumeration("Turbo".into()));
    let err = render_err(&job, &reference());
    assert_eq!(err.field(), "parameters.opt");
    assert_eq!(err.message(), "`Turbo` is not one of the options");
    check(
        name,
        json!({"command": command, "unknownOption": err.to_string()}),
    );
}

/// Case 13: an input file is passed and mounted as `/work/<name>`, read-only as asked, a folder likewise;
/// the subfolder prefixes the subPath; one `data` volume on the storage claim.
#[test]
fn case_13_file_parameters() {
    let job = case("case_13_file_parameters");
    let desired = render(&job, &reference());
    let spec = pod_spec(&desired);
    let user = spec["containers"][0].clone();
    assert_eq!(user["command"], json!(["prog", "/work/x.csv", "/work/ds"]));
    let mounts: Vec<Value> = user["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == "data")
        .cloned()
        .collect();
    assert!(mounts.contains(&json!({"name": "data", "mountPath": "/work/x.csv", "subPath": "home/alice/data/x.csv", "readOnly": true})));
    assert!(mounts.contains(&json!({"name": "data", "mountPath": "/work/ds", "subPath": "home/alice/ds", "readOnly": false})));
    let volume = spec["volumes"][0].clone();
    assert_eq!(
        volume,
        json!({"name": "data", "persistentVolumeClaim": {"claimName": "cephfs", "readOnly": false}})
    );

    let mut config = reference();
    config.pipeline.storage.subfolder = "/prod/".into();
    let prefixed = pod_spec(&render(&job, &config))["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/work/x.csv")
        .unwrap()["subPath"]
        .clone();
    assert_eq!(prefixed, "prod/home/alice/data/x.csv");
    check(
        "case_13_file_parameters",
        json!({"command": user["command"], "mounts": mounts, "volume": volume, "subfolderSubPath": prefixed}),
    );
}

/// Case 14: the output folder is `/work`, read-write.
#[test]
fn case_14_output_folder() {
    let user = user_container(&render(&case("case_14_output_folder"), &reference()));
    let work = user["volumeMounts"][0].clone();
    assert_eq!(
        work,
        json!({"name": "data", "mountPath": "/work", "readOnly": false, "subPath": "home/alice/Jobs/Figlet/42"})
    );
    check("case_14_output_folder", json!({"mount": work}));
}

/// Traced (issue 44, new): a traced job's pod shares its process namespace with the tracer, which alone
/// has CAP_SYS_PTRACE and mounts the trace folder read-write; the job sees its trace read-only at
/// `/work/trace`, its command runs behind the gate inside the output wrapper. The golden file is the
/// whole rendered VolcanoJob. Without an output folder (and no operator folder) it is refused naming
/// `traced`.
#[test]
fn case_33_traced_new() {
    use volcano_runner::pipeline::plugins::{output_files, traced};
    let mut job = case("case_33_traced_new");
    let desired = render(&job, &reference());
    let rendered = vcjob_json(&desired);
    let spec = at(&rendered, "/spec/tasks/0/template/spec");
    assert_eq!(spec["shareProcessNamespace"], true);
    let user = &spec["containers"][0];
    let tracer = &spec["containers"][1];
    assert_eq!(tracer["name"], traced::TRACER_CONTAINER);
    assert_eq!(
        tracer["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["SYS_PTRACE"]})
    );
    assert_eq!(
        tracer["volumeMounts"][1],
        json!({"name": "data", "mountPath": traced::TRACE_MOUNT, "readOnly": false,
               "subPath": "home/alice/Jobs/Figlet/44/trace"})
    );
    assert!(user["volumeMounts"].as_array().unwrap().contains(
        &json!({"name": "data", "mountPath": "/work/trace", "readOnly": true,
                              "subPath": "home/alice/Jobs/Figlet/44/trace"})
    ));
    let command: Vec<String> = serde_json::from_value(user["command"].clone()).unwrap();
    let wrapped = output_files::unwrap(&command).expect("the output wrapper is outermost");
    let argv = traced::ungate(wrapped.argv).expect("the gate is inside it");
    assert_eq!(argv, ["figlet".to_owned(), "Hello, World!".to_owned()]);
    assert_eq!(
        rendered["metadata"]["annotations"]["ucloud.dk/traceFolder"],
        "/home/alice/Jobs/Figlet/44/trace"
    );
    check("case_33_traced_new", rendered.clone());

    job.output_folder = None;
    let refused = render_err(&job, &reference()).to_string();
    assert!(refused.starts_with("traced: "), "{refused}");
    assert!(refused.contains("outputFolder"), "{refused}");
    job.traced = false;
    let plain = vcjob_json(&render(&job, &reference()));
    assert_eq!(
        at(&plain, "/spec/tasks/0/template/spec/containers")
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Case 15: environment templates; `$(VAR)` for `env`; an empty result is left out.
#[test]
fn case_15_environment() {
    let user = user_container(&render(&case("case_15_environment"), &reference()));
    assert_eq!(
        user["env"],
        json!([
            {"name": "GREETING", "value": "Hello, World!"},
            {"name": "HOMEDIR", "value": "$(HOME)"}
        ])
    );
    check("case_15_environment", json!({"env": user["env"]}));
}

/// Case 16: license servers resolve through the configuration; an unknown id is refused with UCloud's
/// message, naming the parameter.
#[test]
fn case_16_license() {
    let config = reference();
    let mut job = case("case_16_license");
    let with_key = user_container(&render(&job, &config))["command"].clone();
    assert_eq!(
        with_key,
        json!(["prog", "--license", "lic.example:1055/abc"])
    );
    let set = |job: &mut volcano_runner::messages::v1::SubmitJob, id: &str| {
        job.parameters.get_mut("lic").unwrap().value = Some(parameter_value::Value::LicenseServer(
            volcano_runner::messages::v1::LicenseServerValue { id: id.into() },
        ));
    };
    set(&mut job, "L2");
    let without_key = user_container(&render(&job, &config))["command"].clone();
    assert_eq!(
        without_key,
        json!(["prog", "--license", "lic.example:1055"])
    );
    set(&mut job, "L9");
    let err = render_err(&job, &config);
    assert_eq!(err.field(), "parameters.lic");
    assert_eq!(err.message(), "Invalid license passed for parameter: lic");
    check(
        "case_16_license",
        json!({"withKey": with_key, "withoutKey": without_key, "unknown": err.to_string()}),
    );
}

/// Case 17: `maxTime` at create; `jobStart` and `expiry` once, when first seen Running (from Volcano's
/// phase history); never again (W4).
#[test]
fn case_17_expiry_annotations() {
    let config = reference();
    let desired = render(&case("case_17_expiry_annotations"), &config);
    let annotations = desired.vcjob.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["ucloud.dk/maxTime"], "5400000");

    let started = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, started);
    let plan = hooks::on_start(&config, &running, &[], ts("2024-05-01T12:01:07Z")).unwrap();
    assert_eq!(
        plan.set["ucloud.dk/jobStart"],
        started.as_millisecond().to_string()
    );
    assert_eq!(
        plan.set["ucloud.dk/expiry"],
        (started.as_millisecond() + 5_400_000).to_string()
    );
    assert_eq!(
        plan.merge_patch().unwrap()["metadata"]["resourceVersion"],
        "100"
    );

    // Seen Running again, e.g. after a restart of the runner: nothing changes.
    let again = hooks::on_start(
        &config,
        &patched(&running, &plan),
        &[],
        ts("2024-05-01T13:00:00Z"),
    )
    .unwrap();
    assert!(
        !again.set.contains_key("ucloud.dk/jobStart")
            && !again.set.contains_key("ucloud.dk/expiry"),
        "{:?}",
        again.set
    );
    check(
        "case_17_expiry_annotations",
        json!({"maxTime": annotations["ucloud.dk/maxTime"], "onStart": plan_json(&plan)}),
    );
}

/// Case 18: at or after the expiry, end the job (`delete`: the executor sends Volcano's TerminateJob),
/// with the cause and the instant it was asked recorded first (W11).
#[test]
fn case_18_expiry_enforcement() {
    let mut config = reference();
    // Accounting would publish the hour's ticks in the same plan; this case is about expiry.
    config.pipeline.plugins.accounting = false;
    let desired = render(&job("jobs/figlet"), &config);
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let started = patched(
        &running,
        &hooks::on_start(&config, &running, &[], start).unwrap(),
    );

    let before = hooks::on_monitoring(&config, &started, &[], ts("2024-05-01T13:00:59Z")).unwrap();
    assert_eq!(before.delete, None);
    let at = hooks::on_monitoring(&config, &started, &[], ts("2024-05-01T13:01:00Z")).unwrap();
    assert_eq!(at.delete, Some(TerminationCause::Expired));
    assert_eq!(at.set["ucloud.dk/terminationCause"], "expired");
    assert_eq!(
        at.set["ucloud.dk/terminationAt"],
        ts("2024-05-01T13:01:00Z").as_millisecond().to_string(),
        "asked to end now: the end of a rank still running then"
    );
    check("case_18_expiry_enforcement", plan_json(&at));

    // With accounting on, the final tick of the deleted job ends at the expiry, not when its pods
    // finished stopping 20 s later.
    let config = reference();
    let deleted = patched(&started, &at);
    let stopped = ts("2024-05-01T13:01:20Z");
    let pods = [pod("42", 0, "10.0.0.5", start, Some(stopped))];
    let later = ts("2024-05-01T13:02:00Z");
    assert_eq!(hooks::ended_at(&deleted, &pods, later), stopped);
    let done = hooks::on_completion(&config, &deleted, &pods, stopped, later).unwrap();
    let last = done
        .publish
        .iter()
        .rev()
        .find_map(|o| match o {
            Outbound::Accounting(t) => Some(t),
            _ => None,
        })
        .unwrap();
    assert!(last.r#final);
    assert_eq!(
        last.interval_end.unwrap().seconds,
        ts("2024-05-01T13:01:00Z").as_second()
    );
    assert_eq!(last.tick_id, "42/59");
}

/// Case 19: extension adds the increment to maxTime and expiry (W21), once per request id (W22); before
/// the start only maxTime moves.
#[test]
fn case_19_extension_fixed_semantics() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let two_hours = SignedDuration::from_hours(2);

    let pending = observed(&desired, JobPhase::Pending, ts("2024-05-01T12:00:06Z"));
    let Extension::Apply {
        plan: early,
        expiry: None,
        ..
    } = expiry::extend(&pending, &config, "r0", two_hours).unwrap()
    else {
        panic!("a pending job only changes maxTime")
    };
    assert_eq!(early.set["ucloud.dk/maxTime"], "10800000");
    assert!(!early.set.contains_key("ucloud.dk/expiry"));

    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let started = patched(
        &running,
        &hooks::on_start(&config, &running, &[], start).unwrap(),
    );
    let expiry_before = start.as_millisecond() + 3_600_000;
    let Extension::Apply { plan, .. } = expiry::extend(&started, &config, "r1", two_hours).unwrap()
    else {
        panic!("expected a patch")
    };
    assert_eq!(plan.set["ucloud.dk/maxTime"], "10800000");
    assert_eq!(
        plan.set["ucloud.dk/expiry"],
        (expiry_before + 7_200_000).to_string()
    );
    assert_eq!(
        plan.merge_patch().unwrap()["metadata"]["resourceVersion"],
        "101"
    );
    let extended = patched(&started, &plan);
    assert_eq!(
        expiry::extend(&extended, &config, "r1", two_hours).unwrap(),
        Extension::AlreadyApplied
    );
    let Extension::Apply { plan: second, .. } =
        expiry::extend(&extended, &config, "r2", two_hours).unwrap()
    else {
        panic!("a new request applies")
    };
    assert_eq!(second.set["ucloud.dk/maxTime"], "18000000");
    check(
        "case_19_extension_fixed_semantics",
        json!({"pending": plan_json(&early), "running": plan_json(&plan), "second": plan_json(&second)}),
    );
}

/// Case 20 (pipeline share): Running runs the start hooks; seeing Running again runs them with no
/// effect (UCloud re-ran them when its 10-minute cache expired, W5).
#[test]
fn case_20_running_start_hooks_run_once() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let first = hooks::on_start(&config, &running, &[], start).unwrap();
    assert!(!first.is_empty());
    let second = hooks::on_start(
        &config,
        &patched(&running, &first),
        &[],
        ts("2024-05-01T12:20:00Z"),
    )
    .unwrap();
    assert!(second.is_empty(), "{:?}", plan_json(&second));
    check(
        "case_20_running_start_hooks_run_once",
        json!({"first": plan_json(&first), "second": plan_json(&second)}),
    );
}

/// Case 21 (changed, pipeline share): a rank that exits non-zero ends the whole job (PodFailed →
/// TerminateJob) instead of leaving the other ranks waiting; the final charge ends at the rank's real end,
/// not when the monitor noticed (W18).
#[test]
fn case_21_nonzero_exit_terminates_whole_job_changed() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    assert!(
        desired
            .vcjob
            .spec
            .policies
            .iter()
            .any(
                |p| p.event.as_ref().map(|e| e.as_str()) == Some("PodFailed")
                    && p.action.as_ref().map(|a| a.as_str()) == Some("TerminateJob")
            )
    );
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let started = patched(
        &running,
        &hooks::on_start(&config, &running, &[], start).unwrap(),
    );
    let end = ts("2024-05-01T12:03:30Z");
    let pods = [pod("42", 0, "10.0.0.5", start, Some(end))];
    let mut failed = started.clone();
    failed.status = observed(&desired, JobPhase::Terminated, ts("2024-05-01T12:03:31Z")).status;
    let now = ts("2024-05-01T12:09:00Z");
    let ended = hooks::ended_at(&failed, &pods, now);
    assert_eq!(ended, end);
    let plan = hooks::on_completion(&config, &failed, &pods, ended, now).unwrap();
    let ticks: Vec<_> = plan
        .publish
        .iter()
        .filter_map(|o| match o {
            Outbound::Accounting(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(ticks.len(), 3);
    assert!(ticks[2].r#final);
    assert_eq!(ticks[2].interval_end.unwrap().seconds, end.as_second());
    check(
        "case_21_nonzero_exit_terminates_whole_job_changed",
        json!({"policies": vcjob_json(&desired)["spec"]["policies"], "completion": plan_json(&plan)}),
    );
}

/// Case 22 (pipeline share): after a cancel the cleanup hook removes the proxy routes, and every
/// companion (the job's NetworkPolicy, ConfigMap, Services) carries an ownerReference, so the cluster
/// deletes them with the job.
#[test]
fn case_22_cancel_cleanup_removes_routes_and_owned_companions() {
    let config = reference();
    let mut desired = render(&case("case_30_minikube_service"), &config);
    desired.set_owner_uid("uid-1");
    for companion in &desired.companions {
        let owner = &companion.metadata().owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Job", "j-42", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
    }
    assert!(
        desired
            .companions
            .iter()
            .any(|c| c.metadata().name.as_deref() == Some("policy-42"))
    );
    let gone = observed(&desired, JobPhase::Running, ts("2024-05-01T12:01:00Z"));
    let plan = hooks::on_cleanup(&config, &gone, ts("2024-05-01T12:30:00Z")).unwrap();
    let [Outbound::Proxy(event)] = plan.publish.as_slice() else {
        panic!("one proxy event: {:?}", plan.publish)
    };
    assert_eq!(event.action, ProxyAction::Remove as i32);
    assert_eq!(event.job_id, "42");
    assert!(plan.merge_patch().is_none() && plan.delete.is_none());
    check(
        "case_22_cancel_cleanup_removes_routes_and_owned_companions",
        json!({
        "ownerReferences": desired.companions[0].metadata().owner_references, "cleanup": plan_json(&plan)}),
    );
}

/// Case 23 (changed): a lost job is reported by its id. UCloud's `verify` reported FAILURE "lost track"
/// for an id the orchestrator listed and the cluster did not have; here the monitor notices the
/// VolcanoJob `j-<id>` vanish before the job's end was recorded, and publishes FAILURE with the reason
/// `lost_track` for the id the name maps back to (only `j-<id>` names are jobs).
#[test]
fn case_23_lost_job_ends_in_failure_for_its_id_changed() {
    let listed = ["j-7", "something-else", "j-"];
    let known: Vec<&str> = listed
        .iter()
        .filter_map(|n| names::job_id_from_vcjob_name(n))
        .collect();
    assert_eq!(known, ["7"]);

    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    assert_eq!(
        names::job_id_from_vcjob_name(desired.vcjob.metadata.name.as_deref().unwrap()),
        Some("42")
    );
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let started = patched(
        &running,
        &hooks::on_start(&config, &running, &[], start).unwrap(),
    );
    let settings = Settings::new(std::sync::Arc::new(config), "runner-1");
    let gone = decide::decide_gone(&started, &[], &settings, ts("2024-05-01T12:03:00Z"), false)
        .unwrap()
        .expect("a vanished job whose end was never recorded is reported");
    let ends: Vec<_> = gone
        .publish
        .iter()
        .filter_map(|o| match o {
            Outbound::Lifecycle(e) if e.state != EventState::Unspecified as i32 => Some(e),
            _ => None,
        })
        .collect();
    let last = ends.last().expect("a terminal event");
    assert_eq!(
        (
            last.job_id.as_str(),
            EventState::try_from(last.state).unwrap(),
            last.reason.as_str()
        ),
        ("42", EventState::Failure, "lost_track")
    );
    assert!(last.status.contains("lost track"), "{}", last.status);
    // Nothing is left to write: the job is gone.
    assert!(gone.set.is_empty() && !gone.delete && !gone.again);
}

/// Case 24 (changed): UCloud refused a submission while paused; here a paused runner leaves it in
/// the queue (tests/runner/gate.rs), so no refusal is rendered. The pipeline's share is that rendering
/// is deterministic: the same submission always gives the same objects and fingerprint, so one taken
/// after the pause is the one that waited.
#[test]
fn case_24_render_is_deterministic_changed() {
    let config = reference();
    let job = job("jobs/figlet");
    let (a, b) = (render(&job, &config), render(&job, &config));
    assert_eq!(a, b);
    let mut other = job.clone();
    other.replicas = 2;
    assert_ne!(
        volcano_runner::pipeline::fingerprint(&job),
        volcano_runner::pipeline::fingerprint(&other)
    );
    assert_eq!(
        a.vcjob.metadata.annotations.as_ref().unwrap()["ucloud.dk/submissionHash"],
        volcano_runner::pipeline::fingerprint(&job)
    );
}

/// Case 25 (changed): fixed ticks of the configured period from the real start (UCloud: one charge per
/// 15-minute scan from the last patch), ids `<jobId>/<n>`, published first and then the cursor advanced;
/// the final tick ends at the real end.
#[test]
fn case_25_accounting_ticks_fixed_period_changed() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let on_start = hooks::on_start(&config, &running, &[], start).unwrap();
    // The first boundary plus the settle delay (10 s): charged once the cluster's view has passed it.
    assert_eq!(on_start.next_check, Some(ts("2024-05-01T12:02:10Z")));
    let started = patched(&running, &on_start);

    let tick_plan =
        hooks::on_monitoring(&config, &started, &[], ts("2024-05-01T12:03:30Z")).unwrap();
    let ids: Vec<String> = tick_plan
        .publish
        .iter()
        .filter_map(|o| match o {
            Outbound::Accounting(t) => Some(t.tick_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["42/0", "42/1"]);
    assert_eq!(tick_plan.set["ucloud.dk/accountedTicks"], "2");
    assert_eq!(tick_plan.next_check, Some(ts("2024-05-01T12:04:10Z")));
    let ticked = patched(&started, &tick_plan);

    // The same look again publishes nothing new.
    let repeat = hooks::on_monitoring(&config, &ticked, &[], ts("2024-05-01T12:03:40Z")).unwrap();
    assert!(
        repeat
            .publish
            .iter()
            .all(|o| !matches!(o, Outbound::Accounting(_)))
    );

    let end = ts("2024-05-01T12:03:41Z");
    let done =
        hooks::on_completion(&config, &ticked, &[], end, ts("2024-05-01T12:05:00Z")).unwrap();
    let [Outbound::Accounting(last)] = done.publish.as_slice() else {
        panic!("{:?}", done.publish)
    };
    assert_eq!(
        (last.tick_id.as_str(), last.duration_ms, last.r#final),
        ("42/2", 41_000, true)
    );
    assert_eq!(done.set["ucloud.dk/accountingFinal"], "true");
    check(
        "case_25_accounting_ticks_fixed_period_changed",
        json!({"monitoring": plan_json(&tick_plan), "completion": plan_json(&done)}),
    );
}

/// Case 26 (changed): peers without host aliases or patches of the peer's policy (W27). The job's pods
/// carry `ucloud.dk/peer-42`, which job 42's own policy admits; the job's policy admits job 42's pods and
/// its own (W28). The hostname `db` is nothing of the namespace's (two jobs may both call their peer
/// `db`): the job has a headless Service of its own without a selector, `j-50-peers`, whose EndpointSlice
/// the monitor fills with `db` at job 42's rank 0 address, and its pods search `j-50-peers.<ns>.svc.<domain>`,
/// so `db` resolves there; the pods are gated (`ucloud.dk/peers`) until the peer runs, and the peers are
/// listed for the monitor (`ucloud.dk/peers: db=42`).
#[test]
fn case_26_peers_label_rules_and_dns_names_changed() {
    let desired = render(
        &case("case_26_peers_label_rules_and_dns_names_changed"),
        &reference(),
    );
    let spec = pod_spec(&desired);
    assert!(spec.get("hostAliases").is_none());
    let labels = at(
        &vcjob_json(&desired),
        "/spec/tasks/0/template/metadata/labels",
    )
    .clone();
    assert_eq!(labels["ucloud.dk/peer-42"], "true");
    let objects = objects_json(&desired);
    let policy = objects
        .iter()
        .find(|o| o["metadata"]["name"] == "policy-50")
        .unwrap()
        .clone();
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["volcano.sh/job-name"],
        "j-50"
    );
    let from = policy["spec"]["ingress"][0]["from"].as_array().unwrap();
    assert!(
        from.contains(&json!({"podSelector": {"matchLabels": {"volcano.sh/job-name": "j-50"}}}))
    );
    // Same-namespace pods only: no rule admits another namespace (another owner's pods could carry the
    // label too).
    assert!(
        from.contains(&json!({"podSelector": {"matchLabels": {"volcano.sh/job-name": "j-42"}}}))
    );
    assert!(from.contains(&json!({"podSelector": {"matchExpressions": [{"key": "ucloud.dk/peer-50", "operator": "Exists"}]}})));
    assert!(
        from.iter()
            .all(|peer| peer.get("namespaceSelector").is_none()),
        "{from:?}"
    );
    let services: Vec<&serde_json::Value> =
        objects.iter().filter(|o| o["kind"] == "Service").collect();
    assert_eq!(services.len(), 1, "one Service, not one per hostname");
    let service = services[0].clone();
    assert_eq!(service["metadata"]["name"], "j-50-peers");
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert!(service["spec"].get("selector").is_none());
    assert!(service["spec"].get("externalName").is_none());
    assert_eq!(
        spec["dnsConfig"]["searches"],
        json!(["j-50-peers.app-kubernetes.svc.cluster.local"])
    );
    assert_eq!(
        spec["schedulingGates"],
        json!([{"name": "ucloud.dk/peers"}])
    );
    let annotations = at(&vcjob_json(&desired), "/metadata/annotations").clone();
    assert_eq!(annotations["ucloud.dk/peers"], "db=42");

    // A job without peers still admits its own pods and any job that names it.
    let alone = render(&job("jobs/figlet"), &reference());
    let alone_policy = objects_json(&alone)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "policy-42")
        .unwrap();
    assert_eq!(
        alone_policy["spec"]["ingress"][0]["from"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    check(
        "case_26_peers_label_rules_and_dns_names_changed",
        json!({"podLabels": labels, "policy": policy, "service": service,
            "dnsConfig": spec["dnsConfig"], "schedulingGates": spec["schedulingGates"],
            "peers": annotations["ucloud.dk/peers"]}),
    );
}

/// Case 27 (changed): the `user` annotation is the project (else the user) as in UCloud, but the job
/// lives in its owner's namespace, declared with its baseline policy; optionally a queue per project.
#[test]
fn case_27_fairshare_namespace_per_owner_changed() {
    let mut config = defaults();
    assert_eq!(config.pipeline.namespace.mode, NamespaceMode::PerOwner);
    let mut job = case("case_27_fairshare_namespace_per_owner_changed");
    let desired = render(&job, &config);
    let annotations = desired.vcjob.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["ucloud.dk/user"], "p1");
    let namespace = desired.job_namespace().to_owned();
    assert!(
        namespace.starts_with("app-p-p1-") && names::is_dns1123_label(&namespace),
        "{namespace}"
    );
    let owned = desired.namespace.as_ref().unwrap();
    assert_eq!(
        owned.namespace.metadata.name.as_deref(),
        Some(namespace.as_str())
    );
    assert_eq!(
        owned.network_policies[0].metadata.namespace.as_deref(),
        Some(namespace.as_str())
    );

    job.owner.as_mut().unwrap().project = None;
    let user = render(&job, &config);
    assert_eq!(
        user.vcjob.metadata.annotations.as_ref().unwrap()["ucloud.dk/user"],
        "alice"
    );
    assert!(user.job_namespace().starts_with("app-u-alice-"));

    job.owner.as_mut().unwrap().project = Some("p1".into());
    config.pipeline.scheduling.queue_per_project = true;
    let queued = render(&job, &config);
    let queue = queued.queue.as_ref().unwrap();
    assert_eq!(queued.vcjob.spec.queue, queue.metadata.name);
    let objects: Vec<Value> = objects_json(&queued).into_iter().take(3).collect();
    assert_eq!(
        objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["Queue", "Namespace", "NetworkPolicy"]
    );
    check(
        "case_27_fairshare_namespace_per_owner_changed",
        json!({"user": annotations["ucloud.dk/user"], "sharedObjects": objects}),
    );
}

/// Case 28: a running 2-replica web app is published with one target per rank (its pod IP and the web
/// port) and its hostnames; with a public link and one replica, the domain goes along.
#[test]
fn case_28_proxy_event_targets_per_rank() {
    let config = reference();
    let mut job = case("case_28_proxy_event_targets_per_rank");
    let desired = render(&job, &config);
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    // Until every rank has a running pod with an IP there is nothing to publish: rank 1's pod missing,
    // then present without an IP.
    let no_proxy = |pods: &[Pod]| {
        hooks::on_start(&config, &running, pods, start)
            .unwrap()
            .publish
            .iter()
            .all(|o| !matches!(o, Outbound::Proxy(_)))
    };
    assert!(no_proxy(&[pod("42", 0, "10.1.0.4", start, None)]));
    assert!(no_proxy(&[
        pod("42", 0, "10.1.0.4", start, None),
        pod("42", 1, "", start, None)
    ]));
    let pods = [
        pod("42", 0, "10.1.0.4", start, None),
        pod("42", 1, "10.1.0.5", start, None),
    ];
    let plan = hooks::on_start(&config, &running, &pods, start).unwrap();
    let Some(Outbound::Proxy(event)) = plan
        .publish
        .iter()
        .find(|o| matches!(o, Outbound::Proxy(_)))
    else {
        panic!()
    };
    assert_eq!(event.action, ProxyAction::Create as i32);
    assert_eq!(event.job_id, "42");
    assert!(event.domains.is_empty());
    let targets: Vec<(u32, &str, u32, &str)> = event
        .targets
        .iter()
        .map(|t| (t.rank, t.pod_ip.as_str(), t.port, t.hostname.as_str()))
        .collect();
    assert_eq!(
        targets,
        [
            (0, "10.1.0.4", 8888, "j-42-job-0.j-42"),
            (1, "10.1.0.5", 8888, "j-42-job-1.j-42")
        ]
    );
    assert_eq!(
        config.pipeline.proxy.rank_host("42", 0),
        "app-42-0.cloud.sdu.dk"
    );
    // Published once per set of targets; a restart with new IPs is an update.
    let published = patched(&running, &plan);
    assert!(
        hooks::on_monitoring(&config, &published, &pods, start)
            .unwrap()
            .publish
            .iter()
            .all(|o| !matches!(o, Outbound::Proxy(_)))
    );
    let moved = [
        pod("42", 0, "10.1.0.9", start, None),
        pod("42", 1, "10.1.0.5", start, None),
    ];
    let update = hooks::on_monitoring(&config, &published, &moved, start).unwrap();
    let Some(Outbound::Proxy(updated)) = update
        .publish
        .iter()
        .find(|o| matches!(o, Outbound::Proxy(_)))
    else {
        panic!("{:?}", update.publish)
    };
    assert_eq!(updated.action, ProxyAction::Update as i32);
    let moved_targets: Vec<(u32, &str)> = updated
        .targets
        .iter()
        .map(|t| (t.rank, t.pod_ip.as_str()))
        .collect();
    assert_eq!(moved_targets, [(0, "10.1.0.9"), (1, "10.1.0.5")]);

    job.replicas = 1;
    job.resources
        .push(volcano_runner::messages::v1::ResourceValue {
            value: Some(resource_value::Value::Ingress(
                volcano_runner::messages::v1::IngressValue {
                    id: "ing1".into(),
                    domain: "app-mylink.cloud.sdu.dk".into(),
                },
            )),
        });
    let linked = render(&job, &config);
    let running = observed(&linked, JobPhase::Running, start);
    let plan_linked = hooks::on_start(&config, &running, &pods[..1], start).unwrap();
    let Some(Outbound::Proxy(linked_event)) = plan_linked
        .publish
        .iter()
        .find(|o| matches!(o, Outbound::Proxy(_)))
    else {
        panic!()
    };
    assert_eq!(linked_event.domains, ["app-mylink.cloud.sdu.dk"]);
    check(
        "case_28_proxy_event_targets_per_rank",
        json!({"twoReplicas": plan_json(&plan), "publicLink": plan_json(&plan_linked)}),
    );
}

/// Beside case 28 (changed: the original gave no shell through the proxy): a TERMINAL application
/// without a web port is routed to the bridges only. It records port 0 and the `terminal` session kind,
/// declares no port on its container, and its CREATE carries port 0 in every target with the pods' IPs
/// (what the terminal bridge finds the pod by). A batch job is not routed at all (W26).
#[test]
fn case_28_terminal_application_is_routed_to_the_bridges_only_changed() {
    let config = reference();
    let mut job = case("case_28_proxy_event_targets_per_rank");
    let app = job.application.as_mut().unwrap();
    app.application_type = volcano_runner::messages::v1::ApplicationType::Terminal as i32;
    app.web_port = None;
    let desired = render(&job, &config);
    let rendered = vcjob_json(&desired);
    let annotations = &rendered["metadata"]["annotations"];
    assert_eq!(annotations["ucloud.dk/proxyPort"], "0");
    assert_eq!(annotations["ucloud.dk/sessionKinds"], "terminal");
    assert_eq!(user_container(&desired)["ports"], Value::Null);
    let start = ts("2024-05-01T12:01:00Z");
    let running = observed(&desired, JobPhase::Running, start);
    let pods = [
        pod("42", 0, "10.1.0.4", start, None),
        pod("42", 1, "10.1.0.5", start, None),
    ];
    let plan = hooks::on_start(&config, &running, &pods, start).unwrap();
    let Some(Outbound::Proxy(event)) = plan
        .publish
        .iter()
        .find(|o| matches!(o, Outbound::Proxy(_)))
    else {
        panic!("{:?}", plan.publish)
    };
    assert_eq!(event.action, ProxyAction::Create as i32);
    let targets: Vec<(u32, &str, u32)> = event
        .targets
        .iter()
        .map(|t| (t.rank, t.pod_ip.as_str(), t.port))
        .collect();
    assert_eq!(targets, [(0, "10.1.0.4", 0), (1, "10.1.0.5", 0)]);
    volcano_runner::validate::proxy_event(event).expect("a valid event");

    let app = job.application.as_mut().unwrap();
    app.application_type = volcano_runner::messages::v1::ApplicationType::Batch as i32;
    let batch = vcjob_json(&render(&job, &config));
    assert_eq!(
        batch["metadata"]["annotations"]["ucloud.dk/proxyPort"],
        Value::Null
    );
    assert_eq!(
        batch["metadata"]["annotations"]["ucloud.dk/sessionKinds"],
        Value::Null
    );
}

/// Case 29: public links and public IPs only with one replica, with UCloud's messages.
#[test]
fn case_29_single_replica_only_resources() {
    let config = reference();
    let mut job = case("case_29_single_replica_only_resources");
    let ingress = render_err(&job, &config);
    assert_eq!(ingress.field(), "resources[0].ingress");
    assert_eq!(
        ingress.message(),
        "UCloud/compute does not currently support ingress with multiple replicas"
    );
    job.resources = vec![volcano_runner::messages::v1::ResourceValue {
        value: Some(resource_value::Value::NetworkIp(
            volcano_runner::messages::v1::NetworkIpValue {
                id: "ip1".into(),
                ip_address: "203.0.113.7".into(),
                open_ports: vec![],
            },
        )),
    }];
    let ip = render_err(&job, &config);
    assert_eq!(
        ip.message(),
        "UCloud/compute does not currently support IPs with multiple nodes"
    );
    job.replicas = 1;
    // One replica: refused where no way to attach the address is configured, attached where one is.
    let refused = render_err(&job, &config);
    assert_eq!(refused.code(), "not_offered", "{refused}");
    assert_eq!(refused.field(), "resources[0].networkIp");
    let mut attaching = config.clone();
    attaching.pipeline.public_ip.attach =
        volcano_runner::pipeline::plugins::network_ip::PublicIpAttach::LoadBalancer;
    let Some(resource_value::Value::NetworkIp(value)) = &mut job.resources[0].value else {
        unreachable!()
    };
    value.open_ports = vec![volcano_runner::messages::v1::PortRange {
        start: 443,
        end: 443,
        protocol: volcano_runner::messages::v1::Protocol::Tcp as i32,
    }];
    render(&job, &attaching);
    check(
        "case_29_single_replica_only_resources",
        json!({"ingress": ingress.to_string(), "networkIp": ip.to_string()}),
    );
}

/// Case 30 (changed): Kata through `runtimeClassName` (not the legacy annotation) for configured products,
/// with the VM overhead taken off: 8 vCPU/16 GiB → 7000m/10240Mi; 1 vCPU/4 GiB → the minimums 1000m/1024Mi.
#[test]
fn case_30_kata_runtime_class_changed() {
    let mut config = reference();
    config.pipeline.kata.products = vec!["u1-kata".into()];
    let mut job = case("case_30_kata_runtime_class_changed");
    let spec = pod_spec(&render(&job, &config));
    assert_eq!(spec["runtimeClassName"], "kata");
    let big = spec["containers"][0]["resources"].clone();
    assert_eq!(big["limits"], json!({"cpu": "7000m", "memory": "10240Mi"}));
    assert_eq!(big["requests"], big["limits"]);
    assert!(
        at(
            &vcjob_json(&render(&job, &config)),
            "/spec/tasks/0/template/metadata/annotations/io.kubernetes.cri.untrusted-workload"
        )
        .is_null()
    );
    let product = job.product.as_mut().unwrap();
    (product.cpu, product.memory_gib) = (1, 4);
    let small = pod_spec(&render(&job, &config))["containers"][0]["resources"]["limits"].clone();
    assert_eq!(small, json!({"cpu": "1000m", "memory": "1024Mi"}));
    // Products not listed are untouched.
    config.pipeline.kata.products.clear();
    assert!(
        pod_spec(&render(&job, &config))
            .get("runtimeClassName")
            .is_none()
    );
    check(
        "case_30_kata_runtime_class_changed",
        json!({"runtimeClassName": spec["runtimeClassName"], "8x16": big["limits"], "1x4": small}),
    );
}

/// Case 30 (Minikube): a LoadBalancer Service `j-42-mk`, port 80 to the web port (else VNC, else 80).
#[test]
fn case_30_minikube_service() {
    let mut config = reference();
    config.pipeline.plugins.minikube = true;
    let mut job = case("case_30_minikube_service");
    let service = |job: &volcano_runner::messages::v1::SubmitJob| {
        objects_json(&render(job, &config))
            .into_iter()
            .find(|o| o["metadata"]["name"] == "j-42-mk")
            .unwrap()
    };
    let web = service(&job);
    assert_eq!(web["spec"]["type"], "LoadBalancer");
    assert_eq!(
        web["spec"]["ports"],
        json!([{"name": "placeholder", "port": 80, "targetPort": 8888, "protocol": "TCP"}])
    );
    assert_eq!(
        web["spec"]["selector"],
        json!({"volcano.sh/job-name": "j-42"})
    );
    let app = job.application.as_mut().unwrap();
    (app.web_port, app.vnc_port, app.application_type) = (None, Some(5901), 3);
    assert_eq!(service(&job)["spec"]["ports"][0]["targetPort"], 5901);
    let app = job.application.as_mut().unwrap();
    (app.vnc_port, app.application_type) = (None, 1);
    assert_eq!(service(&job)["spec"]["ports"][0]["targetPort"], 80);
    check("case_30_minikube_service", web);
}

/// No bandwidth cap unless configured (issue 30; UCloud never capped either, W31): without a cap the
/// pods carry no bandwidth annotation; a global cap applies to every product without an entry; an entry
/// by category, or by id (which wins), replaces it, and an empty entry exempts the product.
#[test]
fn network_limit_caps_only_where_configured() {
    const IN: &str = "kubernetes.io/ingress-bandwidth";
    const OUT: &str = "kubernetes.io/egress-bandwidth";
    let caps = |job: &volcano_runner::messages::v1::SubmitJob,
                config: &volcano_runner::config::Config| {
        let annotations = at(
            &vcjob_json(&render(job, config)),
            "/spec/tasks/0/template/metadata/annotations",
        )
        .clone();
        (
            annotations
                .get(IN)
                .and_then(Value::as_str)
                .map(str::to_owned),
            annotations
                .get(OUT)
                .and_then(Value::as_str)
                .map(str::to_owned),
        )
    };
    let some = |s: &str| Some(s.to_owned());
    let mut job = job("jobs/figlet");
    for config in [defaults(), reference()] {
        assert_eq!(caps(&job, &config), (None, None));
    }

    let mut config = defaults();
    let limits = &mut config.pipeline.network_limit;
    limits.ingress_bandwidth = some("1G");
    limits.egress_bandwidth = some("500M");
    assert_eq!(caps(&job, &config), (some("1G"), some("500M")));

    let product = job.product.as_mut().unwrap();
    (product.id, product.category) = ("u1-standard-8".into(), "u1-standard".into());
    let limits = &mut config.pipeline.network_limit;
    limits.products.insert(
        "u1-standard".into(),
        BandwidthCaps {
            ingress_bandwidth: some("10G"),
            egress_bandwidth: None,
        },
    );
    assert_eq!(caps(&job, &config), (some("10G"), None));
    let products = &mut config.pipeline.network_limit.products;
    products.insert("u1-standard-8".into(), BandwidthCaps::default());
    assert_eq!(caps(&job, &config), (None, None));
    job.product.as_mut().unwrap().id = "u1-standard-4".into();
    assert_eq!(caps(&job, &config), (some("10G"), None));
    job.product.as_mut().unwrap().category = "u1-gpu".into();
    assert_eq!(caps(&job, &config), (some("1G"), some("500M")));

    // A bad value in an entry is refused at start, naming the entry.
    let refused: volcano_runner::config::Config =
        toml::from_str("[pipeline.network_limit.products.u1-gpu]\negress_bandwidth = \"fast\"")
            .unwrap();
    let error = refused.pipeline.validate().unwrap_err().to_string();
    assert!(
        error.contains("pipeline.network_limit.products.u1-gpu.egress_bandwidth"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------------
// Whole jobs: every object, as `volcano-runner render` prints it.

fn whole_job(name: &str, config_name: &str, golden_name: &str) {
    let config = config(config_name);
    let desired = render(&job(&format!("jobs/{name}")), &config);
    let text =
        volcano_runner::cli::render::format(&desired, volcano_runner::cli::render::Format::Yaml)
            .unwrap();
    golden_text(
        &golden_dir().join(format!("jobs/{golden_name}.yaml")),
        &text,
    );
}

/// The figlet job of UCloud's integration test, with the shipped defaults (per-owner namespace).
#[test]
fn whole_job_figlet() {
    whole_job("figlet", "default", "figlet");
}

/// The figlet job with the reference configuration (single namespace, toleration).
#[test]
fn whole_job_figlet_reference_config() {
    whole_job("figlet", "reference", "figlet.reference");
}

/// A 3-rank MPI-style job of a project: files with clashing names (W24), every parameter type,
/// environment, license, an opened file, a peer.
#[test]
fn whole_job_multinode_project() {
    whole_job("multinode_project", "default", "multinode_project");
}

/// An interactive web application with a public link.
#[test]
fn whole_job_web_app_with_public_link() {
    whole_job("web_app", "default", "web_app");
}

/// The benchmark's large job: 64 replicas, 20 parameters, 10 mounts.
#[test]
fn whole_job_large_64_replicas() {
    whole_job("large", "default", "large");
}

/// `-o json` prints one `List` that kubectl accepts, with the same objects as YAML.
#[test]
fn whole_job_json_output_is_a_list() {
    let desired = render(&job("jobs/figlet"), &defaults());
    let text =
        volcano_runner::cli::render::format(&desired, volcano_runner::cli::render::Format::Json)
            .unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap(), &objects_json(&desired));
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["Namespace", "NetworkPolicy", "Job", "NetworkPolicy"]
    );
}

/// Every SubmitJob example of the message schemas (`schemas/examples/`) and every golden input renders
/// to objects the cluster accepts (CRD schema and admission rules), with both configurations.
#[test]
fn every_example_and_golden_input_is_accepted() {
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for dir in [
        golden_dir().join("cases"),
        golden_dir().join("jobs"),
        root().join("schemas/examples"),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path.file_name().unwrap().to_string_lossy().to_lowercase();
            let is_submit = dir.ends_with("examples")
                && name.contains("submit")
                && !name.contains("invalid")
                && !name.contains("bad");
            if path.extension().is_some_and(|e| e == "json")
                && (is_submit || !dir.ends_with("examples"))
            {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 25, "found only {} inputs", files.len());
    let (reference, defaults) = (reference(), defaults());
    let mut rendered = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let job: volcano_runner::messages::v1::SubmitJob = serde_json::from_str(&text).unwrap();
        for config in [&reference, &defaults] {
            // Some golden inputs are deliberately refused (case 29); the rest must be accepted. The
            // shipped defaults price no whole nodes, so a whole-node job is refused under them, for that.
            match volcano_runner::pipeline::render(&job, config, now()) {
                Ok(desired) => {
                    assert_cluster_accepts(&desired);
                    rendered += 1;
                }
                Err(e) if job.exclusive_nodes && std::ptr::eq(config, &defaults) => {
                    assert_eq!(e.field(), "exclusiveNodes", "{}: {e}", path.display());
                    rendered += 1;
                }
                Err(_) => {}
            }
        }
    }
    assert!(
        rendered >= 2 * (files.len() - 1),
        "rendered {rendered} of {}",
        2 * files.len()
    );
}

/// The schema check can fail: a misspelt field, a duplicate mount point and a maxRetry of 0 are caught.
#[test]
fn the_cluster_checks_catch_what_a_cluster_would_refuse() {
    let desired = render(&job("jobs/figlet"), &defaults());
    let mut value = vcjob_json(&desired);
    value["spec"]["maxRetries"] = json!(3);
    assert!(
        schema_errors(&value)
            .iter()
            .any(|e| e.contains("maxRetries")),
        "{:?}",
        schema_errors(&value)
    );

    let mut value = vcjob_json(&desired);
    let mounts = value
        .pointer_mut("/spec/tasks/0/template/spec/containers/0/volumeMounts")
        .unwrap();
    let first = mounts[0].clone();
    mounts.as_array_mut().unwrap().push(first);
    assert!(
        schema_errors(&value)
            .iter()
            .any(|e| e.contains("duplicate")),
        "{:?}",
        schema_errors(&value)
    );

    let mut job = desired.vcjob.clone();
    job.spec.max_retry = Some(0);
    assert!(!admission_errors(&job).is_empty());
    let mut job = desired.vcjob.clone();
    job.spec.policies.push(job.spec.policies[0].clone());
    assert!(
        admission_errors(&job)
            .iter()
            .any(|e| e.contains("duplicate event"))
    );
}

// ---------------------------------------------------------------------------------------------------
// Hook mechanics.

/// One plugin's failure is reported and leaves the others' actions standing (W6, W7): an expiry out of
/// range fails Expiry, accounting still ticks.
#[test]
fn hooks_isolate_a_failing_plugin() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let start = ts("2024-05-01T12:01:00Z");
    let mut running = observed(&desired, JobPhase::Running, start);
    running
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("ucloud.dk/maxTime".into(), i64::MAX.to_string());
    let plan = hooks::on_start(&config, &running, &[], start).unwrap();
    assert_eq!(plan.failures.len(), 1, "{:?}", plan.failures);
    assert_eq!(plan.failures[0].plugin.name(), "Expiry");
    assert!(plan.set.contains_key("ucloud.dk/jobStart"));
    let started = patched(&running, &plan);
    // Two boundaries (12:02, 12:03) and the settle delay past the second.
    let ticks = hooks::on_monitoring(&config, &started, &[], ts("2024-05-01T12:03:10Z")).unwrap();
    assert_eq!(ticks.publish.len(), 2);
    assert_eq!(ticks.failures.len(), 1);
}

/// A malformed annotation makes the job's facts unreadable, naming the annotation; a job that is not
/// volcano-runner's is refused by name.
#[test]
fn hooks_name_the_bad_annotation() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let mut running = observed(&desired, JobPhase::Running, ts("2024-05-01T12:01:00Z"));
    running
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("ucloud.dk/jobStart".into(), "soon".into());
    let err = hooks::on_monitoring(&config, &running, &[], now()).unwrap_err();
    assert_eq!(err.key, "ucloud.dk/jobStart");
    assert_eq!(
        err.to_string(),
        "VolcanoJob j-42: annotation ucloud.dk/jobStart: is not epoch milliseconds"
    );
    running.metadata.name = Some("other".into());
    assert_eq!(
        hooks::on_monitoring(&config, &running, &[], now())
            .unwrap_err()
            .key,
        "metadata.name"
    );
}

/// A job that has not started yet is left alone by monitoring; the real start comes from Volcano's
/// phase history, not from when a runner looked (a runner that was away does not move it).
#[test]
fn hooks_use_the_phase_history_for_the_start() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let pending = observed(&desired, JobPhase::Pending, ts("2024-05-01T12:00:06Z"));
    assert!(
        hooks::on_monitoring(&config, &pending, &[], now())
            .unwrap()
            .is_empty()
    );
    let first_running = ts("2024-05-01T12:01:00Z");
    let mut job = observed(&desired, JobPhase::Running, ts("2024-05-01T12:30:00Z"));
    job.status.as_mut().unwrap().conditions.insert(
        0,
        JobCondition {
            status: JobPhase::Running,
            last_transition_time: Some(Time(first_running)),
        },
    );
    let plan = hooks::on_start(&config, &job, &[], ts("2024-05-01T12:40:00Z")).unwrap();
    assert_eq!(
        plan.set["ucloud.dk/jobStart"],
        first_running.as_millisecond().to_string()
    );
}

/// The merge patch carries the observed resourceVersion (the API server refuses it if the job changed)
/// and nulls for removed annotations.
#[test]
fn hooks_merge_patch_is_guarded_by_the_resource_version() {
    let config = reference();
    let desired = render(&job("jobs/figlet"), &config);
    let running = observed(&desired, JobPhase::Running, ts("2024-05-01T12:01:00Z"));
    let mut plan = hooks::on_start(&config, &running, &[], now()).unwrap();
    plan.remove.insert("ucloud.dk/old".into());
    let patch = plan.merge_patch().unwrap();
    assert_eq!(patch["metadata"]["resourceVersion"], "100");
    assert_eq!(
        patch["metadata"]["annotations"]["ucloud.dk/old"],
        Value::Null
    );
    assert!(patch["metadata"]["annotations"]["ucloud.dk/jobStart"].is_string());
}

/// `deploy/config.d/pipeline.toml` documents the defaults: it parses and equals `PipelineConfig::default()`,
/// so the file and the code cannot drift apart.
#[test]
fn deploy_config_section_matches_the_defaults() {
    let text = std::fs::read_to_string(root().join("deploy/config.d/pipeline.toml")).unwrap();
    let config: volcano_runner::config::Config = toml::from_str(&text).unwrap();
    assert_eq!(
        config.pipeline,
        volcano_runner::pipeline::PipelineConfig::default()
    );
    config.pipeline.validate().unwrap();
}

/// Bad configuration is refused at start with the key and the reason.
#[test]
fn bad_pipeline_configuration_is_refused_with_the_key() {
    let refused = |toml: &str| {
        let config: volcano_runner::config::Config = toml::from_str(toml).unwrap();
        config.pipeline.validate().unwrap_err().to_string()
    };
    assert!(
        refused("[pipeline.scheduling]\nmax_retry = 0").contains("pipeline.scheduling.max_retry")
    );
    assert!(
        refused("[pipeline.multi_node]\ninit_image = \"busybox:latest\"")
            .contains("pipeline.multi_node.init_image")
    );
    assert!(refused("[pipeline.multi_node]\ninit_image = \"busybox\"").contains("pinned"));
    assert!(
        refused("[pipeline]\nannotation_prefix = \"ucloud.dk\"")
            .contains("pipeline.annotation_prefix")
    );
    assert!(
        refused("[pipeline.network_policy]\negress_except = [\"10.0.0.0/33\"]")
            .contains("egress_except")
    );
    assert!(refused("[pipeline.plugins]\ntask = false").contains("pipeline.plugins.task"));
    assert!(
        refused("[pipeline.namespace]\nname = \"Bad_Name\"").contains("pipeline.namespace.name")
    );
    let unknown =
        toml::from_str::<volcano_runner::config::Config>("[pipeline]\nannotation_prefx = \"x/\"");
    assert!(unknown.is_err());
}

/// With `storage.owner_claim`, every owner namespace gets its own storage claim (a PVC is namespaced),
/// applied after the namespace and before the job.
#[test]
fn fairshare_declares_the_storage_claim_in_owner_namespaces() {
    let mut config = defaults();
    config.pipeline.storage.owner_claim = Some(volcano_runner::pipeline::OwnerClaimConfig {
        storage_class_name: Some("cephfs-shared".into()),
        volume_name: Some("ucloud-{namespace}".into()),
        ..Default::default()
    });
    config.pipeline.validate().unwrap();
    let desired = render(&job("jobs/figlet"), &config);
    let objects = objects_json(&desired);
    let kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds[..4],
        ["Namespace", "NetworkPolicy", "PersistentVolumeClaim", "Job"]
    );
    let claim = &objects[2];
    let namespace = desired.job_namespace();
    assert_eq!(claim["metadata"]["name"], "cephfs");
    assert_eq!(claim["metadata"]["namespace"], namespace);
    assert_eq!(claim["spec"]["volumeName"], format!("ucloud-{namespace}"));
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Ti");
    // Single mode declares no namespace and so no claim.
    assert!(
        render(&job("jobs/figlet"), &reference())
            .namespace
            .is_none()
    );
}

/// The trace context goes on the job as an annotation, outside the submission hash.
#[test]
fn traceparent_is_recorded_on_the_job() {
    let config = defaults();
    let mut desired = render(&job("jobs/figlet"), &config);
    let before =
        desired.vcjob.metadata.annotations.as_ref().unwrap()["ucloud.dk/submissionHash"].clone();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    desired.set_traceparent(&config.pipeline.keys(), tp);
    let annotations = desired.vcjob.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["ucloud.dk/traceparent"], tp);
    assert_eq!(annotations["ucloud.dk/submissionHash"], before);
}

/// `volcano-runner render` end to end: the binary prints the golden objects for a job and a
/// configuration file, and refuses a bad job naming the field, with exit status 1.
#[test]
fn render_command_prints_the_objects_and_refuses_bad_jobs() {
    let bin = env!("CARGO_BIN_EXE_volcano-runner");
    let out = std::process::Command::new(bin)
        .args([
            "--config",
            "tests/golden/config/reference.toml",
            "render",
            "tests/golden/jobs/figlet.json",
        ])
        .args(["--now", "2024-05-01T12:00:05Z"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected =
        std::fs::read_to_string(golden_dir().join("jobs/figlet.reference.yaml")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let bad = std::env::temp_dir().join(format!("bad-job-{}.json", std::process::id()));
    let mut job = serde_json::to_value(job("jobs/figlet")).unwrap();
    job["replicas"] = json!(0);
    std::fs::write(&bad, job.to_string()).unwrap();
    let out = std::process::Command::new(bin)
        .arg("render")
        .arg(&bad)
        .output()
        .unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("replicas: must be at least 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[pipeline.scheduling] sla_waiting_time` is written as Volcano's `sla-waiting-time` job annotation, a
/// Go duration, and every rank then tolerates its own job's node reservation (the monitor may reserve
/// nodes for a large gang past its waiting time, `[monitor] reserve_nodes`); unset, neither is written;
/// a negative one is refused with its key.
#[test]
fn sla_waiting_time_is_written_as_volcanos_job_annotation() {
    let job = case("case_01_names");
    let mut config = defaults();
    let without = vcjob_json(&render(&job, &config));
    assert!(
        without["metadata"]["annotations"]
            .get("sla-waiting-time")
            .is_none(),
        "{without:#}"
    );
    assert!(
        without["spec"]["tasks"][0]["template"]["spec"]
            .get("tolerations")
            .is_none(),
        "{without:#}"
    );
    config.pipeline.scheduling.sla_waiting_time = Some(jiff::SignedDuration::from_mins(90));
    let with = vcjob_json(&render(&job, &config));
    assert_eq!(with["metadata"]["annotations"]["sla-waiting-time"], "5400s");
    // The job says its ranks tolerate the reservation: the monitor reserves only for such a job.
    assert_eq!(
        with["metadata"]["annotations"]["ucloud.dk/reservable"],
        "true"
    );
    assert!(
        without["metadata"]["annotations"]
            .get("ucloud.dk/reservable")
            .is_none(),
        "{without:#}"
    );
    assert_eq!(
        with["spec"]["tasks"][0]["template"]["spec"]["tolerations"],
        json!([{"key": "ucloud.dk/reserved", "operator": "Equal",
                "value": job.job_id, "effect": "NoSchedule"}])
    );
    let config: volcano_runner::config::Config =
        toml::from_str("[pipeline.scheduling]\nsla_waiting_time = \"-1m\"").unwrap();
    let refused = config.pipeline.validate().unwrap_err().to_string();
    assert!(
        refused.contains("pipeline.scheduling.sla_waiting_time"),
        "{refused}"
    );
}

/// `[pipeline.scheduling] interactive_queue` and `interactive_sla_waiting_time`: a web, VNC or terminal
/// job goes to the interactive queue with its own waiting time; a batch job where it went, with
/// everyone's (docs/estimates.md, "Interactive jobs: a promise by design").
#[test]
fn interactive_jobs_go_to_their_own_queue_with_their_own_waiting_time() {
    use volcano_runner::messages::v1::ApplicationType;
    let mut config = defaults();
    config.pipeline.scheduling.interactive_queue = Some("live".into());
    config.pipeline.scheduling.interactive_sla_waiting_time = Some(jiff::SignedDuration::ZERO);
    config.pipeline.scheduling.sla_waiting_time = Some(jiff::SignedDuration::from_mins(30));
    let mut job = case("case_01_names");
    let everyones = config.pipeline.scheduling.queue.clone();
    for (kind, queue, wait) in [
        (ApplicationType::Web, "live", "0s"),
        (ApplicationType::Vnc, "live", "0s"),
        (ApplicationType::Terminal, "live", "0s"),
        (ApplicationType::Batch, everyones.as_str(), "1800s"),
    ] {
        job.application.as_mut().unwrap().application_type = kind as i32;
        let vc = vcjob_json(&render(&job, &config));
        assert_eq!(vc["spec"]["queue"], queue, "{kind:?}");
        assert_eq!(
            vc["metadata"]["annotations"]["sla-waiting-time"], wait,
            "{kind:?}"
        );
    }
    // A booked one waits, gated, for its start: not at the head of the fifo queue.
    job.application.as_mut().unwrap().application_type = ApplicationType::Web as i32;
    job.start_window = Some(volcano_runner::messages::v1::StartWindow::default());
    assert_eq!(
        vcjob_json(&render(&job, &config))["spec"]["queue"],
        everyones.as_str()
    );
    // The defaults: the interactive queue deploy/scheduling declares, 0 s; "" switches them off.
    let scheduling = volcano_runner::pipeline::PipelineConfig::default().scheduling;
    assert_eq!(
        scheduling.interactive_queue.as_deref(),
        Some("volcano-runner-interactive")
    );
    assert_eq!(
        scheduling.interactive_sla_waiting_time,
        Some(jiff::SignedDuration::ZERO)
    );
    let off: volcano_runner::config::Config = toml::from_str(
        "[pipeline.scheduling]\ninteractive_queue = \"\"\ninteractive_sla_waiting_time = \"\"",
    )
    .unwrap();
    assert_eq!(off.pipeline.scheduling.interactive_queue, None);
    assert_eq!(off.pipeline.scheduling.interactive_sla_waiting_time, None);
    let config: volcano_runner::config::Config =
        toml::from_str("[pipeline.scheduling]\ninteractive_queue = \"Not A Queue\"").unwrap();
    let refused = config.pipeline.validate().unwrap_err().to_string();
    assert!(
        refused.contains("pipeline.scheduling.interactive_queue"),
        "{refused}"
    );
}
