//! Interactive pods and exec, through the real kube client: a pod that declares a `vnc` or `web`
//! container port is served on a loopback IP of its own until it ends or the simulator stops, and
//! `pods/{name}/exec` runs a real command over WebSocket with the channel protocol kube-rs speaks.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, PostParams};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::sim_support::{dynamic, eventually, gang_job, jobs, namespace, start};

const NS: &str = "interactive";

/// A one-pod job running `command`, its container changed by `edit`.
async fn run_job(
    sim: &volcano_runner::sim::SimHandle,
    client: &kube::Client,
    name: &str,
    command: &[&str],
    edit: impl FnOnce(&mut serde_json::Value),
) -> Pod {
    namespace(client, NS).await;
    let mut job = gang_job(name, NS, 1, "1", command);
    edit(&mut job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]);
    jobs(client, NS)
        .create(&PostParams::default(), &dynamic(job))
        .await
        .unwrap();
    sim.advance(Duration::from_secs(2));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = format!("{name}-job-0");
    eventually(&format!("{pod} running"), || async {
        pods.get_opt(&pod)
            .await
            .unwrap()
            .and_then(|p| p.status?.phase)
            .as_deref()
            == Some("Running")
    })
    .await;
    pods.get(&pod).await.unwrap()
}

async fn read_all(mut r: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut s = String::new();
    r.read_to_string(&mut s).await.unwrap();
    s
}

/// Exec runs the command for real in the pod's scratch directory, with the container's environment:
/// stdout and stderr come back on their channels and a non-zero exit code in the closing Status, as
/// the kubelet reports it. Once the pod has completed, exec is refused as the API server refuses it.
#[tokio::test]
async fn exec_runs_the_command_with_the_containers_environment_and_reports_its_exit_code() {
    let (sim, client) = start().await;
    run_job(&sim, &client, "shell", &["sleep", "100"], |c| {
        c["env"] = json!([{"name": "GREETING", "value": "hello from the pod"}]);
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut process = pods
        .exec(
            "shell-job-0",
            ["sh", "-c", "echo \"$GREETING\"; pwd; echo oops >&2; exit 3"],
            &AttachParams::default().stdout(true).stderr(true),
        )
        .await
        .expect("exec is served");
    let stdout = process.stdout().unwrap();
    let stderr = process.stderr().unwrap();
    let status = process.take_status().unwrap();
    let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
    let status = status.await.expect("a closing status");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("hello from the pod"));
    let dir = lines.next().expect("the working directory");
    assert!(
        dir.contains("volcano-runner-sim-"),
        "the pod's scratch directory: {dir}"
    );
    assert_eq!(err, "oops\n");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
    assert_eq!(causes[0].message.as_deref(), Some("3"));
    process.join().await.unwrap();
    assert!(std::path::Path::new(dir).is_dir());

    // stdin reaches the command; a zero exit is a Success.
    let mut process = pods
        .exec(
            "shell-job-0",
            ["sh", "-c", "read line; echo \"got $line\""],
            &AttachParams::default()
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = process.stdin().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"42\n")
        .await
        .unwrap();
    let status = process.take_status().unwrap();
    let out = read_all(process.stdout().unwrap()).await;
    assert_eq!(out, "got 42\n");
    assert_eq!(status.await.unwrap().status.as_deref(), Some("Success"));

    // The program ends: the pod completes, its scratch directory goes, and exec is refused.
    sim.advance(Duration::from_secs(200));
    let Err(e) = pods
        .exec("shell-job-0", ["true"], &AttachParams::default())
        .await
    else {
        panic!("no exec into a completed pod");
    };
    assert!(
        e.to_string()
            .contains("cannot exec into a container in a completed pod"),
        "{e}"
    );
    assert!(!std::path::Path::new(dir).exists(), "{dir} is removed");
}

/// A pod declaring a `vnc` port is served on its loopback IP (the RFB greeting) while it runs; shutting
/// the simulator down closes its listener.
#[tokio::test]
async fn an_interactive_pod_is_served_on_loopback_until_the_simulator_stops() {
    let (sim, client) = start().await;
    let pod = run_job(&sim, &client, "desk", &["sleep", "100"], |c| {
        c["ports"] = json!([{"name": "vnc", "containerPort": 5907}]);
    })
    .await;
    let ip: std::net::Ipv4Addr = pod.status.unwrap().pod_ip.unwrap().parse().unwrap();
    assert!(ip.is_loopback(), "{ip}");
    let mut conn = tokio::net::TcpStream::connect((ip, 5907)).await.unwrap();
    let mut greeting = [0u8; 12];
    conn.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting, b"RFB 003.008\n");
    drop(conn);

    sim.shutdown().await;
    eventually("the listener closed", || async {
        matches!(
            tokio::net::TcpStream::connect((ip, 5907)).await,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    })
    .await;
}
