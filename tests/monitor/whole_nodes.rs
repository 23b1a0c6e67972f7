//! Whole nodes are paid for: the ticks of a whole-node job, decided by the monitor from what the job
//! records, charge what the operator charges for a whole node and carry `exclusiveNodes`; a shared job
//! beside it is charged its product.

use crate::monitor_support;

use monitor_support::*;

#[tokio::test]
async fn a_whole_node_jobs_ticks_charge_the_whole_node_and_say_so() {
    let mut w = World::start(
        "mon-whole-nodes",
        |c| {
            c.pipeline.whole_nodes.products.insert(
                "u1-standard".into(),
                toml::from_str("product = \"u1-standard-node\"\ncpu = 16\nmemory_gib = 64")
                    .unwrap(),
            );
        },
        |_| {},
    )
    .await;
    let runner = w.runner("runner-a").await;
    runner.holds(4).await;
    let mut whole = job("wn1", "sleep 90");
    whole.exclusive_nodes = true;
    w.submit(&whole).await;
    w.submit(&job("sh1", "sleep 90")).await;
    w.advance(1);
    w.until("a first event of each", |s| {
        !s.of("wn1").lifecycle.is_empty() && !s.of("sh1").lifecycle.is_empty()
    })
    .await;
    w.advance(2);
    w.until("both RUNNING", |s| {
        s.event("wn1/RUNNING").is_some() && s.event("sh1/RUNNING").is_some()
    })
    .await;
    for _ in 0..4 {
        w.advance(30);
    }
    w.until("both SUCCESS and final ticks", |s| {
        ["wn1", "sh1"].iter().all(|id| {
            let seen = s.of(id);
            seen.event(&format!("{id}/SUCCESS")).is_some() && seen.has_final_tick()
        })
    })
    .await;
    for (id, product, cpu, memory_gib, exclusive) in [
        ("wn1", "u1-standard-node", 16, 64, true),
        ("sh1", "u1-standard-1", 1, 4, false),
    ] {
        let seen = w.seen.of(id);
        let success = seen.event(&format!("{id}/SUCCESS")).unwrap().clone();
        let ticks = seen.unique_ticks();
        check_ticks(id, &ticks, ms(&success.started_at), ms(&success.ended_at));
        assert_eq!(ticks.len(), 2, "{id}: 60 s + 30 s");
        for t in &ticks {
            assert_eq!(
                (
                    t.product_id.as_str(),
                    t.cpu,
                    t.memory_gib,
                    t.gpu,
                    t.replicas
                ),
                (product, cpu, memory_gib, 0, 1),
                "{id}: {t:?}"
            );
            assert_eq!(t.exclusive_nodes, exclusive, "{id}: {t:?}");
        }
    }
    runner.stop().await;
    w.close().await;
}
