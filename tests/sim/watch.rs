//! Watches through the real kube client: raw watch events, selectors on watches, 410 Gone, and
//! `kube::runtime::watcher` recovering after a cut watch and after 410; list and watch of 10,000 objects.

use crate::sim_support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use sim_support::*;
use volcano_runner::sim::FaultRule;

fn cm(name: &str, tier: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"tier": tier}}, "data": {"k": "v"}}),
    )
    .unwrap()
}

const WAIT: Duration = Duration::from_secs(10);

/// A raw watch of config maps from resourceVersion "0": every object as ADDED, then every change.
async fn raw_watch(
    api: &Api<ConfigMap>,
) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>> {
    api.watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed()
}

async fn next<S: futures::Stream + Unpin>(s: &mut S) -> S::Item {
    tokio::time::timeout(WAIT, s.next())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
}

#[tokio::test]
async fn raw_watch_reports_added_modified_deleted_in_order() {
    let (_sim, client) = start().await;
    namespace(&client, "w").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "w");
    api.create(&PostParams::default(), &cm("before", "a"))
        .await
        .unwrap();
    let mut stream = raw_watch(&api).await;
    match next(&mut stream).await.unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.name_any(), "before"),
        other => panic!("{other:?}"),
    }
    api.create(&PostParams::default(), &cm("x", "a"))
        .await
        .unwrap();
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    api.delete("x", &DeleteParams::default()).await.unwrap();
    let mut rvs = Vec::new();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let (kind, obj) = match next(&mut stream).await.unwrap() {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("{other:?}"),
        };
        assert_eq!(obj.name_any(), "x");
        kinds.push(kind);
        rvs.push(obj.resource_version().unwrap().parse::<u64>().unwrap());
    }
    assert_eq!(kinds, vec!["ADDED", "MODIFIED", "DELETED"]);
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
}

/// The simulator writes each change out once and shares it between the write's answer and every
/// watch: what each of them gets must still be the object as stored, and a removal must carry the
/// removal's own version in full and in metadata-only watches.
#[tokio::test]
async fn a_writes_answer_and_every_watch_carry_the_same_object() {
    let (_sim, client) = start().await;
    namespace(&client, "shared").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "shared");
    let meta: Api<kube::api::PartialObjectMeta<ConfigMap>> =
        Api::namespaced(client.clone(), "shared");
    let mut full = raw_watch(&api).await;
    let mut full2 = raw_watch(&api).await;
    let mut partial = meta
        .watch_metadata(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    let created = api
        .create(&PostParams::default(), &cm("x", "a"))
        .await
        .unwrap();
    let patched = api
        .patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["k"], "w");
    api.delete("x", &DeleteParams::default()).await.unwrap();

    for stream in [&mut full, &mut full2] {
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(match next(stream).await.unwrap() {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                other => panic!("{other:?}"),
            });
        }
        assert_eq!(seen[0], ("ADDED", created.clone()));
        assert_eq!(seen[1], ("MODIFIED", patched.clone()));
        let (kind, gone) = &seen[2];
        assert_eq!(*kind, "DELETED");
        let gone_rv: u64 = gone.resource_version().unwrap().parse().unwrap();
        let patched_rv: u64 = patched.resource_version().unwrap().parse().unwrap();
        assert!(gone_rv > patched_rv, "{gone_rv} after {patched_rv}");
        let mut expected = patched.clone();
        expected.metadata.resource_version = gone.metadata.resource_version.clone();
        assert_eq!(*gone, expected, "the last state, at the removal's version");
    }
    let mut versions = Vec::new();
    for want in [&created, &patched] {
        match next(&mut partial).await.unwrap() {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                assert_eq!(o.metadata, want.metadata);
                versions.push(o.metadata.resource_version.unwrap());
            }
            other => panic!("{other:?}"),
        }
    }
    match next(&mut partial).await.unwrap() {
        WatchEvent::Deleted(o) => {
            let rv: u64 = o.metadata.resource_version.unwrap().parse().unwrap();
            assert!(rv > versions[1].parse().unwrap());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn watch_with_selector_sees_objects_leave_and_enter() {
    let (_sim, client) = start().await;
    namespace(&client, "ws").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "ws");
    api.create(&PostParams::default(), &cm("a", "web"))
        .await
        .unwrap();
    let rv = version_now(&api).await;
    let mut stream = watch_from(&api, &WatchParams::default().labels("tier=web"), &rv).await;
    let left = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "db"}}, "data": {"k": "left"}})),
        )
        .await
        .unwrap();
    // As Kubernetes' watch cache sends it: the object as it was while it matched, at the version of the
    // change that took it out (the watcher never sees the content it does not select).
    match next(&mut stream).await.unwrap() {
        WatchEvent::Deleted(o) => {
            assert_eq!(o.name_any(), "a");
            assert_eq!(o.labels()["tier"], "web", "{o:?}");
            assert_eq!(o.data.as_ref().unwrap()["k"], "v", "{o:?}");
            assert_eq!(o.resource_version(), left.resource_version());
        }
        other => panic!("{other:?}"),
    }
    api.create(&PostParams::default(), &cm("ignored", "db"))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "web"}}})),
    )
    .await
    .unwrap();
    assert!(
        matches!(next(&mut stream).await.unwrap(), WatchEvent::Added(o) if o.name_any() == "a")
    );
}

#[tokio::test]
async fn too_old_resource_version_is_410_gone() {
    let (sim, client) = start().await;
    namespace(&client, "gone").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "gone");
    let first = api
        .create(&PostParams::default(), &cm("a", "x"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("b", "x"))
        .await
        .unwrap();
    sim.compact_history();
    let mut stream = watch_from(
        &api,
        &WatchParams::default(),
        &first.resource_version().unwrap(),
    )
    .await;
    match next(&mut stream).await.unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 410, got {other:?}"),
    }
    // A continue token from before the compaction is expired too.
    for i in 0..3 {
        api.create(&PostParams::default(), &cm(&format!("c{i}"), "x"))
            .await
            .unwrap();
    }
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    api.create(&PostParams::default(), &cm("later", "x"))
        .await
        .unwrap();
    sim.compact_history();
    let err = api
        .list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), 410);
}

/// The watch history is shared by every kind, but a watch of one kind expires only when its own
/// changes leave it (a real API server keeps a watch cache per resource): a burst of other objects does
/// not push a quiet kind's watches into 410 Gone and a relist. Its bookmarks still name the current
/// version, though the burst never woke it.
#[tokio::test]
async fn a_quiet_kind_stays_watchable_while_a_busy_kind_rolls_the_history() {
    let (_sim, client) = start_with(|c| {
        c.watch_history = 20;
        c.bookmark_interval = Duration::from_millis(200);
    })
    .await;
    namespace(&client, "quiet").await;
    let quiet: Api<ConfigMap> = Api::namespaced(client.clone(), "quiet");
    let busy: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "quiet");
    let rv = quiet
        .create(&PostParams::default(), &cm("q", "x"))
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let mut live = watch_from(&quiet, &WatchParams::default(), &rv).await;
    let mut first_busy = None;
    for i in 0..60 {
        let s: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(json!({"metadata": {"name": format!("s{i}")}})).unwrap();
        let made = busy.create(&PostParams::default(), &s).await.unwrap();
        first_busy.get_or_insert(made.resource_version().unwrap());
    }
    let last_busy: u64 = version_now(&busy).await.parse().unwrap();
    // The open watch's bookmarks come to name a version at or after the burst.
    loop {
        match next(&mut live).await.unwrap() {
            WatchEvent::Bookmark(b)
                if b.metadata.resource_version.parse::<u64>().unwrap() >= last_busy =>
            {
                break;
            }
            WatchEvent::Bookmark(_) => continue,
            other => panic!("{other:?}"),
        }
    }
    // A watch resumed from before the burst has lost nothing of its kind.
    let mut resumed = watch_from(&quiet, &WatchParams::default().disable_bookmarks(), &rv).await;
    quiet
        .patch(
            "q",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    for stream in [&mut resumed, &mut live] {
        loop {
            match next(stream).await.unwrap() {
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Modified(o) => {
                    assert_eq!(o.data.unwrap()["k"], "w");
                    break;
                }
                other => panic!("expected the change, got {other:?}"),
            }
        }
    }
    // The busy kind's own history did roll: a watch of it from its first object is gone.
    let mut old = watch_from(&busy, &WatchParams::default(), &first_busy.unwrap()).await;
    match next(&mut old).await.unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_and_initial_events_end() {
    let (_sim, client) = start_with(|c| c.bookmark_interval = Duration::from_millis(100)).await;
    namespace(&client, "bm").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "bm");
    api.create(&PostParams::default(), &cm("a", "x"))
        .await
        .unwrap();
    // Streaming list: initial ADDED events, then a bookmark marking their end.
    let mut stream = api
        .watch(&WatchParams::default().initial_events(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        next(&mut stream).await.unwrap(),
        WatchEvent::Added(_)
    ));
    match next(&mut stream).await.unwrap() {
        WatchEvent::Bookmark(b) => assert_eq!(
            b.metadata
                .annotations
                .get("k8s.io/initial-events-end")
                .map(String::as_str),
            Some("true")
        ),
        other => panic!("{other:?}"),
    }
    // An idle watch gets periodic bookmarks.
    match next(&mut stream).await.unwrap() {
        WatchEvent::Bookmark(b) => assert!(b.metadata.resource_version.parse::<u64>().unwrap() > 0),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn timeout_seconds_ends_a_watch_cleanly() {
    let (_sim, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv = version_now(&api).await;
    let started = std::time::Instant::now();
    let mut stream = watch_from(
        &api,
        &WatchParams::default().timeout(1).disable_bookmarks(),
        &rv,
    )
    .await;
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the server ends the watch");
    assert!(end.is_none(), "no events, then the end: {end:?}");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

/// Names of the objects a watcher has applied, following its events until `want` are all seen.
async fn watcher_until_seen(
    stream: &mut (
             impl futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin
         ),
    want: &BTreeSet<String>,
    inits: &mut usize,
) {
    let mut seen = BTreeSet::new();
    while !want.is_subset(&seen) {
        match tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("watcher event in time")
        {
            Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => {
                seen.insert(o.name_any());
            }
            Some(Ok(watcher::Event::Init)) => *inits += 1,
            Some(Ok(_)) | Some(Err(_)) => {}
            None => panic!("watcher ended"),
        }
    }
}

#[tokio::test]
async fn watcher_recovers_after_cut_watches() {
    let (sim, client) = start().await;
    namespace(&client, "cut").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "cut");
    // Every watch connection drops after two events.
    sim.faults().add_rule(FaultRule {
        resource: "configmaps".into(),
        verb: "watch".into(),
        watch_cut_after_events: Some(2),
        ..Default::default()
    });
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut inits = 0;
    watcher_until_seen(&mut stream, &BTreeSet::new(), &mut inits).await;
    let mut want = BTreeSet::new();
    for i in 0..7 {
        api.create(&PostParams::default(), &cm(&format!("o{i}"), "x"))
            .await
            .unwrap();
        want.insert(format!("o{i}"));
    }
    watcher_until_seen(&mut stream, &want, &mut inits).await;
    // It resumed from its resourceVersion each time rather than listing again.
    assert!(inits <= 1, "re-listed {inits} times");

    // Cut by the handle: the watcher resumes and sees later changes.
    sim.faults().clear();
    sim.cut_watches();
    api.create(&PostParams::default(), &cm("after-cut", "x"))
        .await
        .unwrap();
    watcher_until_seen(
        &mut stream,
        &BTreeSet::from(["after-cut".to_string()]),
        &mut inits,
    )
    .await;
}

#[tokio::test]
async fn watcher_relists_after_410_gone() {
    let (sim, client) = start_with(|c| c.bookmark_interval = Duration::from_secs(3600)).await;
    namespace(&client, "relist").await;
    namespace(&client, "noise").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "relist");
    api.create(&PostParams::default(), &cm("first", "x"))
        .await
        .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut inits = 0;
    watcher_until_seen(
        &mut stream,
        &BTreeSet::from(["first".to_string()]),
        &mut inits,
    )
    .await;
    assert_eq!(inits, 1);
    // Changes elsewhere move the cluster on without telling this watcher; then history is compacted
    // and its connection drops: it resumes from a resourceVersion that is gone, gets 410, and lists again.
    let noise: Api<ConfigMap> = Api::namespaced(client.clone(), "noise");
    for i in 0..5 {
        noise
            .create(&PostParams::default(), &cm(&format!("n{i}"), "x"))
            .await
            .unwrap();
    }
    sim.compact_history();
    sim.cut_watches();
    api.create(&PostParams::default(), &cm("second", "x"))
        .await
        .unwrap();
    watcher_until_seen(
        &mut stream,
        &BTreeSet::from(["second".to_string()]),
        &mut inits,
    )
    .await;
    assert_eq!(inits, 2, "the watcher listed again after 410 Gone");
}

#[tokio::test]
async fn list_and_watch_ten_thousand_objects() {
    let (_sim, client) = start_with(|c| c.events = false).await;
    namespace(&client, "big").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "big");
    futures::stream::iter(0..10_000)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &cm(
                        &format!("cm-{i:05}"),
                        if i % 2 == 0 { "even" } else { "odd" },
                    ),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("10,000 creates");
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 10_000);
    assert_eq!(all.items[0].name_any(), "cm-00000");
    assert_eq!(all.items[9_999].name_any(), "cm-09999");
    let odd = api
        .list(&ListParams::default().labels("tier=odd"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 5_000);

    // The watcher pages through them (500 at a time), then follows changes.
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut initial = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("in time")
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(_) => initial += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(initial, 10_000);
    api.delete("cm-04242", &DeleteParams::default())
        .await
        .unwrap();
    match next(&mut stream).await.unwrap() {
        watcher::Event::Delete(o) => assert_eq!(o.name_any(), "cm-04242"),
        other => panic!("{other:?}"),
    }
    // A raw watch from "0" streams all of them as ADDED.
    let raw = raw_watch(&api).await;
    let added = raw.take(9_999).try_collect::<Vec<_>>().await.unwrap();
    assert_eq!(added.len(), 9_999);
}
