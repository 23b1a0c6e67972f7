//! Traced jobs (`SubmitJob.traced`, `[pipeline.traced]`) in the simulator, with events through the real
//! RabbitMQ: the pod gets the tracer beside the job and shares its process namespace, the job's command
//! runs behind the gate (inside the output wrapper, whose file is still written), the tracer ends with
//! the job, and the RUNNING and terminal events and `job <id>` say where the trace is. What the tracer
//! and the gate do in a real pod is tested with the real strace in `pipeline::plugins::traced`.

use crate::monitor_support;

use monitor_support::*;
use serde_json::Value;
use volcano_runner::messages::v1::{JobEvent, SubmitJob};
use volcano_runner::pipeline::plugins::traced;

fn traced_job(job_id: &str, script: &str) -> SubmitJob {
    let mut job = job(job_id, script);
    job.output_folder = Some(format!("/home/alice/Jobs/{job_id}"));
    job.traced = true;
    job
}

/// The event names the trace folder and every rank's file.
fn names_the_trace(event: &JobEvent, job_id: &str, ranks: u32, max_bytes: u64) {
    let trace = event
        .trace
        .as_ref()
        .unwrap_or_else(|| panic!("{} names where the trace is", event.event_id));
    let folder = format!("/home/alice/Jobs/{job_id}/trace");
    assert_eq!(trace.folder, folder);
    let files: Vec<String> = (0..ranks)
        .map(|r| format!("{folder}/trace-{r}.txt"))
        .collect();
    assert_eq!(trace.files, files);
    assert_eq!(trace.max_bytes, max_bytes);
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("the pod has a container {name}: {pod}"))
}

#[tokio::test]
async fn a_traced_job_runs_beside_its_tracer_which_ends_with_it_and_its_events_say_so() {
    let dir = std::env::temp_dir().join(format!("vr-storage-traced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = World::start(
        "traced-success",
        |_| {},
        |s| s.storage_dir = Some(dir.clone()),
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = traced_job("t1", "echo computing; sleep 30; echo done");
    job.replicas = 2;
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("t1/RUNNING").is_some())
        .await;
    let max = w.config.pipeline.traced.max_bytes;
    names_the_trace(&w.seen.event("t1/RUNNING").unwrap().clone(), "t1", 2, max);

    let pod = w.pod(&ns, "j-t1-job-1").expect("rank 1's pod");
    assert_eq!(
        pod.pointer("/spec/shareProcessNamespace"),
        Some(&Value::Bool(true))
    );
    let tracer = container(&pod, traced::TRACER_CONTAINER);
    assert_eq!(
        tracer
            .pointer("/securityContext/capabilities/add/0")
            .and_then(Value::as_str),
        Some("SYS_PTRACE")
    );
    let user = container(&pod, "user-job");
    let command: Vec<&str> = user["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(command.contains(&traced::GATE), "the gate: {command:?}");
    let read_only = user["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/work/trace")
        .expect("the trace is mounted in the job");
    assert_eq!(read_only["readOnly"], true);
    assert_eq!(read_only["subPath"], "home/alice/Jobs/t1/trace");

    for _ in 0..5 {
        w.advance(10);
    }
    w.until("SUCCESS", |s| s.event("t1/SUCCESS").is_some())
        .await;
    let success = w.seen.event("t1/SUCCESS").unwrap().clone();
    names_the_trace(&success, "t1", 2, max);
    // The output wrapper around the gate still keeps every rank's output.
    for name in ["stdout.txt", "stdout-1.txt"] {
        assert_eq!(
            std::fs::read_to_string(dir.join("cephfs/home/alice/Jobs/t1").join(name)).unwrap(),
            "computing\ndone\n",
            "{name}"
        );
    }
    // The job ended with its program (30 s), not with a tracer left running.
    let started = ms(&success.started_at);
    let ended = ms(&success.ended_at);
    assert!(ended - started < 45_000, "{started}..{ended}");

    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), &ns);
    let vcjob = api.get("j-t1").await.unwrap();
    let view = volcano_runner::cli::job::view(&vcjob, &w.keys).expect("a runner's job");
    let traced = view.traced.as_ref().expect("job <id> says it is traced");
    assert_eq!(traced.why, "asked by the submission");
    assert_eq!(traced.folder, "/home/alice/Jobs/t1/trace");
    assert!(
        view.text()
            .lines()
            .any(|l| l.starts_with("Traced:") && l.contains("yes (asked by the submission)")),
        "{}",
        view.text()
    );
    runner.stop().await;
    w.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// The operator traces every job of a project, whatever the submission says; CANCELLED names the trace.
#[tokio::test]
async fn the_operator_traces_a_projects_jobs_and_a_cancel_names_the_trace() {
    let mut w = World::start(
        "traced-policy",
        |c| c.pipeline.traced.projects = vec!["registry-study".into()],
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = traced_job("t2", "echo reading; sleep infinity");
    job.traced = false;
    job.owner.as_mut().unwrap().project = Some("registry-study".into());
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("t2/RUNNING").is_some())
        .await;
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), &ns);
    // As a cancel does: the cause first, then the delete.
    api.patch(
        "j-t2",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            w.keys.termination_cause.as_str(): "cancelled",
            w.keys.termination_reason.as_str(): "the user stopped it",
        }}})),
    )
    .await
    .unwrap();
    api.delete("j-t2", &Default::default()).await.unwrap();
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("CANCELLED", |s| s.event("t2/CANCELLED").is_some())
        .await;
    let cancelled = w.seen.event("t2/CANCELLED").unwrap().clone();
    names_the_trace(&cancelled, "t2", 1, w.config.pipeline.traced.max_bytes);

    // Another project's job is not traced.
    let mut other = traced_job("t3", "echo plain; sleep 5");
    other.traced = false;
    w.submit(&other).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("t3/RUNNING").is_some())
        .await;
    assert!(w.seen.event("t3/RUNNING").unwrap().trace.is_none());
    runner.stop().await;
    w.close().await;
}
