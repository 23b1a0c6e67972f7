//! Bad query parameters get a Kubernetes-style 400 Status from the simulator, never a panic of the
//! handler: a `sinceSeconds` that reaches back past the earliest instant there is once overflowed the
//! time arithmetic of the pod-log handler; a watch's `timeoutSeconds` near 2^63 overflowed its deadline.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::sim_support::{code, dynamic, eventually, gang_job, jobs, namespace, start, status};

const NS: &str = "bad-input";

/// `GET path` through the kube client: the body, or the API error.
async fn get(client: &Client, path: &str) -> Result<String, kube::Error> {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    client.request_text(request).await
}

/// A running pod whose log has three lines.
async fn pod_with_a_log(sim: &volcano_runner::sim::SimHandle, client: &Client) -> String {
    namespace(client, NS).await;
    let script = "echo one; echo two; echo three; sleep 600";
    jobs(client, NS)
        .create(
            &PostParams::default(),
            &dynamic(gang_job("talk", NS, 1, "1", &["sh", "-c", script])),
        )
        .await
        .unwrap();
    sim.advance(Duration::from_secs(1));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    eventually("talk-job-0 running", || async {
        pods.get_opt("talk-job-0")
            .await
            .unwrap()
            .and_then(|p| p.status?.phase)
            .as_deref()
            == Some("Running")
    })
    .await;
    format!("/api/v1/namespaces/{NS}/pods/talk-job-0/log")
}

/// Every out-of-range or malformed log parameter is a 400 BadRequest Status naming the parameter, and
/// the simulator goes on serving; in-range limits do what they say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_log_parameters_out_of_range_are_400s() {
    let (sim, client) = start().await;
    let log = pod_with_a_log(&sim, &client).await;
    let full = get(&client, &log).await.unwrap();
    assert_eq!(full.lines().count(), 3, "{full}");

    for (query, parameter) in [
        ("sinceSeconds=9223372036854775807", "sinceSeconds"),
        ("sinceSeconds=99999999999999", "sinceSeconds"),
        ("sinceSeconds=0", "sinceSeconds"),
        ("sinceSeconds=soon", "sinceSeconds"),
        ("sinceTime=yesterday", "sinceTime"),
        ("tailLines=-1", "tailLines"),
        ("tailLines=many", "tailLines"),
        ("tailLines=99999999999999999999", "tailLines"),
        ("limitBytes=0", "limitBytes"),
        ("limitBytes=-5", "limitBytes"),
        ("limitBytes=1kB", "limitBytes"),
    ] {
        let err = get(&client, &format!("{log}?{query}"))
            .await
            .expect_err(query);
        assert_eq!(code(&err), 400, "{query}: {err:?}");
        let s = status(&err);
        assert_eq!(s.reason, "BadRequest", "{query}: {s:?}");
        assert!(s.message.contains(parameter), "{query}: {}", s.message);
    }

    // Still serving, and limits within range apply.
    assert_eq!(get(&client, &log).await.unwrap(), full);
    let last = full.lines().last().unwrap();
    assert_eq!(
        get(&client, &format!("{log}?tailLines=1")).await.unwrap(),
        format!("{last}\n")
    );
    assert_eq!(
        get(&client, &format!("{log}?tailLines=9223372036854775807"))
            .await
            .unwrap(),
        full
    );
    assert_eq!(
        get(&client, &format!("{log}?limitBytes=5")).await.unwrap(),
        full[..5]
    );
    assert_eq!(
        get(&client, &format!("{log}?limitBytes=9223372036854775807"))
            .await
            .unwrap(),
        full
    );
    // A long but representable look back is the whole log.
    assert_eq!(
        get(&client, &format!("{log}?sinceSeconds=315360000000"))
            .await
            .unwrap(),
        full
    );
}

/// A watch's `timeoutSeconds` beyond what a clock holds is no timeout (the watch opens); one that is
/// not an integer is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_timeouts_beyond_any_clock_open_and_malformed_ones_are_400s() {
    let (_sim, client) = start().await;
    namespace(&client, NS).await;
    let watch = format!("/api/v1/namespaces/{NS}/configmaps?watch=true");
    for timeout in ["9223372036854775807", "18446744073709551615000"] {
        let request = http::Request::get(format!("{watch}&timeoutSeconds={timeout}"))
            .body(Vec::new())
            .unwrap();
        let response = client
            .send(request.map(Into::into))
            .await
            .expect("the watch opens");
        // 18446744073709551615000 does not fit an i64: a 400, like any non-integer.
        let expected = if timeout.len() > 19 { 400 } else { 200 };
        assert_eq!(response.status().as_u16(), expected, "{timeout}");
    }
    let err = get(&client, &format!("{watch}&timeoutSeconds=soon"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 400);
    assert!(
        status(&err).message.contains("timeoutSeconds"),
        "{}",
        status(&err).message
    );
}

/// A create whose body is protobuf (what a real API server accepts for built-in kinds, and kubectl can be
/// told to send) gets a 415 naming the content type, not a JSON decode error; JSON with a charset and YAML
/// still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_in_a_format_the_simulator_does_not_speak_is_a_415_naming_it() {
    let (_sim, client) = start().await;
    namespace(&client, NS).await;
    let path = format!("/api/v1/namespaces/{NS}/configmaps");
    let post = |content_type: &str, body: Vec<u8>| {
        http::Request::post(path.as_str())
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body)
            .unwrap()
    };
    let protobuf = client
        .request_text(post(
            "application/vnd.kubernetes.protobuf",
            b"k8s\x00\x0a\x0f\x0a\x02v1\x12\x09ConfigMap".to_vec(),
        ))
        .await
        .expect_err("protobuf is refused");
    let kube::Error::Api(status) = protobuf else {
        panic!("{protobuf:?}");
    };
    assert_eq!(status.code, 415, "{status:?}");
    assert_eq!(status.reason, "UnsupportedMediaType");
    assert!(
        status
            .message
            .contains("application/vnd.kubernetes.protobuf"),
        "{}",
        status.message
    );

    let json = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"as-json"}}"#.to_vec();
    client
        .request_text(post("application/json; charset=utf-8", json))
        .await
        .expect("JSON with a charset is JSON");
    let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: as-yaml\n".to_vec();
    client
        .request_text(post("application/yaml", yaml))
        .await
        .expect("YAML is accepted");
}
