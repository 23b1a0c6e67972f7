//! Every rank's output kept in the job's output folder (`[pipeline.output]`), at every end: success,
//! failure, expiry, cancel, and a runner killed at that moment. The simulator's storage directory stands
//! for the claim (`[sim] storage_dir`), and it writes what the job's output wrapper writes; the terminal
//! events name the files (`JobEvent.output`) and, on EXPIRED and CANCELLED, carry the log tails.

use crate::monitor_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use monitor_support::*;
use volcano_runner::messages::v1::{JobEvent, SubmitJob};
use volcano_runner::pipeline::plugins::output_files::KEPT;

/// A storage directory of its own for each test.
fn storage(label: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vr-storage-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A job writing into `/home/alice/Jobs/<id>`.
fn with_output(mut job: SubmitJob) -> SubmitJob {
    job.output_folder = Some(format!("/home/alice/Jobs/{}", job.job_id));
    job
}

/// A rank's file in the storage (claim `cephfs`, the default), or `None` when it was never written.
fn file(storage: &Path, job_id: &str, name: &str) -> Option<String> {
    std::fs::read_to_string(
        storage
            .join("cephfs/home/alice/Jobs")
            .join(job_id)
            .join(name),
    )
    .ok()
}

/// The terminal event names the output folder and every rank's file.
fn names_the_files(event: &JobEvent, job_id: &str, ranks: u32, max_bytes: u64) {
    let output = event
        .output
        .as_ref()
        .unwrap_or_else(|| panic!("{} names where the output is", event.event_id));
    let folder = format!("/home/alice/Jobs/{job_id}");
    assert_eq!(output.folder, folder);
    let expected: Vec<String> = (0..ranks)
        .map(|r| {
            if r == 0 {
                format!("{folder}/stdout.txt")
            } else {
                format!("{folder}/stdout-{r}.txt")
            }
        })
        .collect();
    assert_eq!(output.files, expected);
    assert_eq!(output.max_bytes, max_bytes);
}

/// Every rank of a successful job has its whole output in its file, and SUCCESS says where.
#[tokio::test]
async fn every_rank_of_a_successful_job_has_its_output_file() {
    let dir = storage("success");
    let mut w = World::start("out-success", |_| {}, |s| s.storage_dir = Some(dir.clone())).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = with_output(job("o1", "echo computing; sleep 30; echo done"));
    job.replicas = 2;
    w.submit(&job).await;
    for _ in 0..5 {
        w.advance(10);
    }
    w.until("SUCCESS", |s| s.event("o1/SUCCESS").is_some())
        .await;
    assert_eq!(
        file(&dir, "o1", "stdout.txt").as_deref(),
        Some("computing\ndone\n")
    );
    assert_eq!(
        file(&dir, "o1", "stdout-1.txt").as_deref(),
        Some("computing\ndone\n")
    );
    let success = w.seen.event("o1/SUCCESS").unwrap().clone();
    names_the_files(&success, "o1", 2, w.config.pipeline.output.max_bytes);
    runner.stop().await;
    w.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// A failed job's file has everything up to its exit; output past `max_bytes` is cut with the marker.
#[tokio::test]
async fn a_failed_jobs_output_is_kept_and_bounded_with_a_marker() {
    let dir = storage("failure");
    let mut w = World::start(
        "out-failure",
        |c| c.pipeline.output.max_bytes = 20,
        |s| s.storage_dir = Some(dir.clone()),
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let job = with_output(job(
        "o2",
        "echo 0123456789; sleep 10; echo 'out of cheese'; exit 3",
    ));
    w.submit(&job).await;
    for _ in 0..4 {
        w.advance(10);
    }
    w.until("FAILURE", |s| s.event("o2/FAILURE").is_some())
        .await;
    let whole = "0123456789\nout of cheese\n";
    let kept_text = file(&dir, "o2", "stdout.txt").expect("the file is written");
    assert_eq!(kept_text.as_bytes(), KEPT.kept(whole.as_bytes(), 20));
    assert!(
        kept_text.starts_with("0123456789\nout of ch"),
        "{kept_text}"
    );
    assert!(kept_text.contains("output cut here"), "{kept_text}");
    let failure = w.seen.event("o2/FAILURE").unwrap().clone();
    names_the_files(&failure, "o2", 1, 20);
    // The tail is the log's, whole (the bound is the file's).
    assert!(
        failure
            .log_tails
            .iter()
            .any(|t| t.tail.contains("out of cheese")),
        "{:?}",
        failure.log_tails
    );
    runner.stop().await;
    w.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// Deletes the job as a cancel does: cause, reason and the logs' tails first (`end_tails::snapshot`,
/// which the runner's cancel calls), then the delete.
async fn cancel(w: &World, ns: &str, job_id: &str) {
    let api: kube::Api<volcano_runner::volcano::VolcanoJob> =
        kube::Api::namespaced(w.client.clone(), ns);
    let job = api.get(&format!("j-{job_id}")).await.unwrap();
    let budget = volcano_runner::monitor::end_tails::Budget::of(&w.config);
    let (key, tails) =
        volcano_runner::monitor::end_tails::snapshot(&w.client, &job, &w.keys.prefix, budget)
            .await
            .expect("the running ranks' logs are read");
    api.patch(
        &format!("j-{job_id}"),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            w.keys.termination_cause.as_str(): "cancelled",
            w.keys.termination_reason.as_str(): "the user stopped it",
            key: tails,
        }}})),
    )
    .await
    .unwrap();
    api.delete(&format!("j-{job_id}"), &Default::default())
        .await
        .unwrap();
}

/// Waits until the VolcanoJob is being ended (terminated, or deleted).
async fn until_deleting(w: &World, ns: &str, job_id: &str) {
    w.until_ending(ns, job_id).await;
}

/// A cancelled job: every rank's file holds what it wrote until it was stopped, and CANCELLED carries
/// the tails and names the files.
#[tokio::test]
async fn a_cancelled_jobs_files_and_tails_hold_its_output() {
    let dir = storage("cancel");
    let mut w = World::start("out-cancel", |_| {}, |s| s.storage_dir = Some(dir.clone())).await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut job = with_output(job(
        "o3",
        "echo step one; sleep 20; echo step two; sleep infinity",
    ));
    job.replicas = 2;
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("o3/RUNNING").is_some())
        .await;
    w.advance(60);
    cancel(&w, &ns, "o3").await;
    for _ in 0..4 {
        w.advance(5);
    }
    w.until("CANCELLED", |s| s.event("o3/CANCELLED").is_some())
        .await;
    for name in ["stdout.txt", "stdout-1.txt"] {
        assert_eq!(
            file(&dir, "o3", name).as_deref(),
            Some("step one\nstep two\n"),
            "{name}"
        );
    }
    let cancelled = w.seen.event("o3/CANCELLED").unwrap().clone();
    names_the_files(&cancelled, "o3", 2, w.config.pipeline.output.max_bytes);
    let mut ranks: Vec<u32> = cancelled
        .log_tails
        .iter()
        .filter(|t| t.tail.contains("step two"))
        .map(|t| t.rank)
        .collect();
    ranks.sort();
    assert_eq!(
        ranks,
        [0, 1],
        "every rank's tail: {:?}",
        cancelled.log_tails
    );
    runner.stop().await;
    w.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// An expired job, with its monitor killed the moment it deleted the job: the file is complete, and
/// the runner that takes over publishes EXPIRED with the tails and the files.
#[tokio::test]
async fn an_expired_jobs_output_survives_its_monitor_killed_at_the_expiry() {
    let dir = storage("expiry");
    let mut w = World::start("out-expiry", |_| {}, |s| s.storage_dir = Some(dir.clone())).await;
    let a = w.runner("runner-a").await;
    a.holds(4).await;
    let mut job = with_output(job(
        "o4",
        "echo started; sleep 100; echo halfway; sleep infinity",
    ));
    job.time_allocation = Some(pbjson_types::Duration {
        seconds: 600,
        nanos: 0,
    });
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    w.advance(2);
    w.until("RUNNING", |s| s.event("o4/RUNNING").is_some())
        .await;
    let start = ms(&w.seen.event("o4/RUNNING").unwrap().started_at);
    w.advance_to_ms(start + 600_000);
    until_deleting(&w, &ns, "o4").await;
    // Killed right after it deleted the job: nobody records the outcome while the pods stop.
    a.kill().await;
    w.advance(5);
    let b = w.runner("runner-b").await;
    b.holds(4).await;
    w.advance(5);
    w.until("EXPIRED", |s| s.event("o4/EXPIRED").is_some())
        .await;
    assert_eq!(
        file(&dir, "o4", "stdout.txt").as_deref(),
        Some("started\nhalfway\n")
    );
    let expired = w.seen.event("o4/EXPIRED").unwrap().clone();
    names_the_files(&expired, "o4", 1, w.config.pipeline.output.max_bytes);
    assert!(
        expired
            .log_tails
            .iter()
            .any(|t| t.rank == 0 && t.tail.contains("halfway")),
        "the tail of the expired job: {:?}",
        expired.log_tails
    );
    b.stop().await;
    w.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}
