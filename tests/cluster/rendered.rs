//! The applier with what the pipeline really renders (a multi-node project job with the shipped
//! defaults: per-project queue, per-owner namespace with baseline policies, the VolcanoJob and its
//! companions), against the simulator's CRD schemas and Volcano admission. A second render of the same
//! submission (another instant, as on a redelivery) is recognised by its submission hash.

use crate::common;

use std::path::PathBuf;

use common::*;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use volcano_runner::cluster::{Applier, RetryPolicy, Role, Step};
use volcano_runner::config::Config;
use volcano_runner::durable::AnnotationKeys;
use volcano_runner::messages::v1::SubmitJob;
use volcano_runner::pipeline::{self, DesiredJob};
use volcano_runner::runner::plan;

fn golden(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The plan for the applier: each rendered object with its role, in the pipeline's order, made as the
/// runner makes it (from the typed object).
fn steps(desired: &DesiredJob) -> Vec<Step> {
    desired
        .objects()
        .iter()
        .map(|o| plan::step(o).unwrap())
        .collect()
}

#[tokio::test]
async fn a_rendered_job_applies_and_a_redelivery_is_recognised() {
    let env = start().await;
    let config: Config = toml::from_str(&golden("config/default.toml")).unwrap();
    let job: SubmitJob = serde_json::from_str(&golden("jobs/multinode_project.json")).unwrap();
    let keys = AnnotationKeys::new(&config.pipeline.annotation_prefix);
    let applier = Applier::new(
        env.client.clone(),
        RetryPolicy::from_config(&env.config),
        keys.submission_hash.clone(),
    );

    let first = pipeline::render(&job, &config, "2026-05-01T10:00:00Z".parse().unwrap()).unwrap();
    let plan = steps(&first);
    assert!(
        plan.iter().any(|s| s.role == Role::Companion),
        "the example has companions"
    );
    let outcome = applier.apply(&plan).await.unwrap();
    assert!(!outcome.primary_existed);

    let uid = outcome.primary.uid.clone().unwrap();
    for step in plan.iter().filter(|s| s.role != Role::Shared) {
        let key = step.key();
        let api: Api<DynamicObject> = Api::namespaced_with(
            env.client.clone(),
            key.namespace.as_deref().unwrap(),
            &step.resource,
        );
        let stored = api
            .get(&key.name)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        if step.role == Role::Companion {
            assert!(
                stored.owner_references().iter().any(|r| r.uid == uid),
                "{key} is not owned by the job"
            );
        }
    }

    let again = pipeline::render(&job, &config, "2026-05-01T10:07:00Z".parse().unwrap()).unwrap();
    let redelivered = applier.apply(&steps(&again)).await.unwrap();
    assert!(redelivered.primary_existed);
    assert!(redelivered.created.is_empty(), "{:?}", redelivered.created);
    assert_eq!(redelivered.primary.uid, Some(uid));
}

/// A submission holds its plan for the whole apply (64 of them at once in the benchmark): each object's
/// fields as the text sent, not as a JSON tree (a map node of about 640 bytes per JSON object, however
/// few its fields), which took a figlet job's plan to some 40 KiB.
#[test]
fn a_plan_holds_its_objects_in_about_the_bytes_it_sends() {
    let config: Config = toml::from_str(&golden("config/default.toml")).unwrap();
    for example in ["figlet.json", "multinode_project.json"] {
        let job: SubmitJob = serde_json::from_str(&golden(&format!("jobs/{example}"))).unwrap();
        let desired =
            pipeline::render(&job, &config, "2026-05-01T10:00:00Z".parse().unwrap()).unwrap();
        let trees: usize = desired
            .objects()
            .iter()
            .map(|o| volcano_runner::sim::store::tree_bytes(&serde_json::to_value(o).unwrap()))
            .sum();
        let plan = steps(&desired);
        let held: usize = plan.iter().map(Step::heap_bytes).sum();
        let sent: usize = plan.iter().map(|s| s.body(None).unwrap().len()).sum();
        eprintln!("{example}: plan held in {held} bytes, sends {sent}, as trees {trees}");
        assert!(
            held <= sent * 3 / 2,
            "{example}: the plan holds {held} bytes for {sent} bytes of objects"
        );
        assert!(
            held * 4 <= trees,
            "{example}: the plan holds {held} bytes, its objects as trees {trees}"
        );
    }
}
