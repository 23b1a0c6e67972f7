//! `pods/{name}/exec` over WebSocket, as the real API server serves it to kube-rs and kubectl: the
//! channel subprotocols `v5.channel.k8s.io` (preferred) and `v4.channel.k8s.io`, each binary frame
//! prefixed with its channel (0 stdin, 1 stdout, 2 stderr, 3 the closing `Status`, 4 resize; with v5,
//! `[255, 0]` closes stdin).
//!
//! What runs is a real process on this machine: the command, in the pod's scratch directory
//! ([`super::interactive`]), with the container's environment (its `env` values; `valueFrom` is not
//! resolved) plus `PATH`, `HOME` (the scratch directory) and `HOSTNAME` (the pod's name), as the user
//! who runs the simulator. There is no terminal (`tty=true` is accepted and gets pipes), and resize
//! messages are ignored. The session ends when the command does (its exit code in the Status), when the
//! client goes (the process is killed), or when the pod ends (killed, with a Failure Status saying so).
//! The simulator is a development tool bound to loopback; docs/sim.md says so.
//!
//! A pod whose NetworkPolicies let it open no connection at all (a sealed job of one rank) runs the
//! command in a network namespace of its own, empty, so its connections fail for real; any other pod's
//! commands share this machine's network (policies are only evaluated, [`super::netpol`]).

use std::process::Stdio;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::error::ApiError;
use super::interactive::ExecTarget;
use super::json::JsonPath;
use super::server::{Shared, error_response};
use crate::ws;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// The subprotocols served, in the order of preference.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// What an exec request asks for.
#[derive(Debug)]
struct ExecRequest {
    command: Vec<String>,
    container: Option<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

impl ExecRequest {
    fn parse(params: &[(String, String)]) -> Result<Self, ApiError> {
        let flag = |k: &str| {
            params
                .iter()
                .any(|(n, v)| n == k && matches!(v.as_str(), "true" | "1" | ""))
        };
        let command: Vec<String> = params
            .iter()
            .filter(|(n, _)| n == "command")
            .map(|(_, v)| v.clone())
            .collect();
        if command.is_empty() {
            return Err(ApiError::bad_request(
                "you must specify at least one command for the container",
            ));
        }
        let r = Self {
            command,
            container: params
                .iter()
                .find(|(n, _)| n == "container")
                .map(|(_, v)| v.clone()),
            stdin: flag("stdin"),
            stdout: flag("stdout"),
            stderr: flag("stderr"),
        };
        if !(r.stdin || r.stdout || r.stderr) {
            return Err(ApiError::bad_request(
                "you must specify at least 1 of stdin, stdout, stderr",
            ));
        }
        Ok(r)
    }
}

/// What an exec runs in: the container's environment, the pod's scratch directory, and whether the pod's
/// NetworkPolicies close every way out ([`super::netpol::egress_closed`]: then the command gets an empty
/// network namespace of its own, so a connection really fails).
struct Prepared {
    env: Vec<(String, String)>,
    target: ExecTarget,
    no_network: bool,
}

/// The container's environment, the scratch directory and the pod's name, checked to be running.
fn prepare(shared: &Shared, ns: &str, name: &str, req: &ExecRequest) -> Result<Prepared, ApiError> {
    shared.with(|c| {
        let pod = c.core.get(c.core.ids.pods, ns, name)?;
        let containers = pod
            .at("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let container = match &req.container {
            Some(n) => containers
                .iter()
                .find(|x| x["name"].as_str() == Some(n.as_str()))
                .ok_or_else(|| {
                    ApiError::bad_request(format!("container {n} is not valid for pod {name}"))
                })?,
            None if containers.len() == 1 => &containers[0],
            None => {
                let names: Vec<&str> = containers.iter().filter_map(|x| x["name"].as_str()).collect();
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    names.join(" ")
                )));
            }
        };
        let container_name = container["name"].as_str().unwrap_or_default();
        let phase = pod.at("/status/phase").and_then(Value::as_str).unwrap_or("Pending");
        if phase == "Succeeded" || phase == "Failed" {
            return Err(ApiError::bad_request(format!(
                "cannot exec into a container in a completed pod; current phase is {phase}"
            )));
        }
        let running = pod
            .at("/status/containerStatuses")
            .and_then(Value::as_array)
            .and_then(|l| l.iter().find(|s| s["name"].as_str() == Some(container_name)))
            .is_some_and(|s| s.at("/state/running").is_some());
        if !running || pod.at("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::bad_request(format!(
                "unable to upgrade connection: container {container_name} not found in pod {name} (it is not running)"
            )));
        }
        let uid = pod.at("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
        let key = c.core.key_of(c.core.ids.pods, ns, name);
        let target = c
            .model
            .interactive
            .exec_target(&key, uid)
            .map_err(|e| ApiError::internal(format!("making the pod's scratch directory: {e}")))?
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unable to upgrade connection: pod {name} is not running"
                ))
            })?;
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOME".into(), target.dir.display().to_string()),
            ("HOSTNAME".into(), name.to_owned()),
        ];
        for e in container.get("env").and_then(Value::as_array).into_iter().flatten() {
            if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                env.push((k.to_owned(), v.to_owned()));
            }
        }
        let no_network = super::netpol::pod_egress_closed(&c.core, ns, name);
        Ok(Prepared {
            env,
            target,
            no_network,
        })
    })
}

/// The command line that runs `command`, in a network namespace of its own (nothing in it but a loopback
/// that is down) when `no_network`: `unshare --net`, with a user namespace too unless the simulator runs
/// as root (creating a network namespace takes CAP_SYS_ADMIN). Without `unshare` the exec fails rather
/// than run the command with the network open.
fn command_line(command: &[String], no_network: bool) -> Vec<String> {
    if !no_network {
        return command.to_vec();
    }
    let mut line = vec!["unshare".to_owned(), "--net".to_owned()];
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        line.push("--map-root-user".to_owned());
    }
    line.push("--".to_owned());
    line.extend(command.iter().cloned());
    line
}

/// `GET|POST /api/v1/namespaces/{ns}/pods/{name}/exec`.
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    Path((ns, name)): Path<(String, String)>,
    Query(params): Query<Vec<(String, String)>>,
    mut request: Request,
) -> Response {
    // Checked before the upgrade is taken, so a bad request gets its Status as a plain answer.
    let exec = match ExecRequest::parse(&params) {
        Ok(e) => e,
        Err(e) => return error_response(&e),
    };
    let accepted = match ws::accept(&mut request, &PROTOCOLS, &[]) {
        Ok(a) => a,
        Err(e) => return error_response(&ApiError::bad_request(e.to_string())),
    };
    let prepared = match prepare(&shared, &ns, &name, &exec) {
        Ok(x) => x,
        Err(e) => return error_response(&e),
    };
    let v5 = accepted.protocol == Some(PROTOCOLS[0]);
    let response = accepted.response();
    tokio::spawn(async move {
        if let Some(socket) = accepted.socket().await {
            run(socket, exec, prepared, v5).await;
        }
    });
    response
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::binary(v)
}

fn status_frame(status: &Value) -> Message {
    frame(STATUS, &serde_json::to_vec(status).unwrap_or_default())
}

/// The `Status` for a finished command, as the kubelet reports it.
fn exit_status(command: &[String], code: Option<i32>) -> Value {
    match code {
        Some(0) => json!({"metadata": {}, "status": "Success"}),
        Some(code) => json!({"metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", command.join(" ")),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}}),
        None => json!({"metadata": {}, "status": "Failure",
            "message": format!("command [{}] was killed by a signal", command.join(" ")),
            "reason": "InternalError"}),
    }
}

/// Reads into `buf` from a pipe that may be absent (then never ready).
async fn read_opt<R: tokio::io::AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn run<S>(ws: WebSocketStream<S>, exec: ExecRequest, prepared: Prepared, v5: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Prepared {
        env,
        target,
        no_network,
    } = prepared;
    let (mut tx, mut rx) = ws.split();
    let piped = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let line = command_line(&exec.command, no_network);
    let spawned = tokio::process::Command::new(&line[0])
        .args(&line[1..])
        .current_dir(&target.dir)
        .env_clear()
        .envs(env)
        .stdin(piped(exec.stdin))
        .stdout(piped(exec.stdout))
        .stderr(piped(exec.stderr))
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                "message": format!("OCI runtime exec failed: exec failed: unable to start container process: exec: {:?}: {e}", exec.command[0])});
            let _ = tx.send(status_frame(&status)).await;
            let _ = tx.close().await;
            return;
        }
    };
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (mut out_buf, mut err_buf) = (vec![0u8; 8192], vec![0u8; 8192]);
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            () = target.stop.cancelled() => {
                let _ = child.kill().await;
                let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                    "message": "the container stopped: its pod ended"});
                let _ = tx.send(status_frame(&status)).await;
                let _ = tx.close().await;
                return;
            }
            n = read_opt(&mut stdout, &mut out_buf) => match n {
                Ok(n) if n > 0 => if tx.send(frame(STDOUT, &out_buf[..n])).await.is_err() { break },
                _ => stdout = None,
            },
            n = read_opt(&mut stderr, &mut err_buf) => match n {
                Ok(n) if n > 0 => if tx.send(frame(STDERR, &err_buf[..n])).await.is_err() { break },
                _ => stderr = None,
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(data))) => match data.first() {
                    Some(&STDIN) => {
                        if let Some(pipe) = stdin.as_mut()
                            && pipe.write_all(&data[1..]).await.is_err()
                        {
                            stdin = None;
                        }
                    }
                    Some(&CLOSE) if v5 && data.get(1) == Some(&STDIN) => stdin = None,
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    // The client went: so does the command.
                    let _ = child.kill().await;
                    return;
                }
                Some(Ok(_)) => {}
            },
        }
    }
    drop(stdin);
    let code = tokio::select! {
        () = target.stop.cancelled() => {
            let _ = child.kill().await;
            None
        }
        status = child.wait() => status.ok().and_then(|s| s.code()),
    };
    let _ = tx
        .send(status_frame(&exit_status(&exec.command, code)))
        .await;
    let _ = tx.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_requests_are_checked_as_the_api_server_does() {
        let p = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect::<Vec<_>>()
        };
        let e = ExecRequest::parse(&p(&[("stdout", "true")])).unwrap_err();
        assert!(
            e.to_status()["message"]
                .as_str()
                .unwrap()
                .contains("at least one command")
        );
        let e = ExecRequest::parse(&p(&[("command", "ls")])).unwrap_err();
        assert!(
            e.to_status()["message"]
                .as_str()
                .unwrap()
                .contains("at least 1 of stdin")
        );
        let r = ExecRequest::parse(&p(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("stdout", "true"),
            ("container", "user-job"),
        ]))
        .unwrap();
        assert_eq!(r.command, ["sh", "-c", "echo hi"]);
        assert_eq!(r.container.as_deref(), Some("user-job"));
        assert!(r.stdout && !r.stdin && !r.stderr);
    }

    #[test]
    fn a_non_zero_exit_is_reported_with_its_code() {
        let s = exit_status(&["sh".into(), "-c".into(), "exit 3".into()], Some(3));
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(exit_status(&[], Some(0))["status"], "Success");
    }
}
