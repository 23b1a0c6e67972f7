//! Interactive jobs end to end below the proxy: the simulator serves interactive pods on loopback (a
//! web page, an RFB handshake, exec), and the session bridges of proxy-sync reach them (VNC over a
//! WebSocket, a terminal through the Kubernetes exec API, every rank's log live). Real RabbitMQ, the
//! simulator over HTTP, the runner's monitor publishing the proxy events.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;
use volcano_runner::messages::v1::{ApplicationType, SubmitJob};
use volcano_runner::proxy::HostNaming;
use volcano_runner::proxy::bridge::{BridgeContext, Bridges};

use crate::monitor_support::{PATIENCE, TestRunner, World, web_job};
use crate::support::{self, Instance, cancel};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A VNC job with `replicas` ranks on port 5901.
pub(crate) fn vnc_job(job_id: &str, replicas: u32, script: &str) -> SubmitJob {
    let mut job = web_job(job_id, replicas, script);
    if let Some(app) = job.application.as_mut() {
        app.application_type = ApplicationType::Vnc as i32;
        app.web_port = None;
        app.vnc_port = Some(5901);
    }
    job
}

/// A TERMINAL application with `replicas` ranks and no web port: routed to the bridges only.
pub(crate) fn terminal_job(job_id: &str, replicas: u32, script: &str) -> SubmitJob {
    let mut job = web_job(job_id, replicas, script);
    if let Some(app) = job.application.as_mut() {
        app.application_type = ApplicationType::Terminal as i32;
        app.web_port = None;
    }
    job
}

/// Submits `job` and waits until `sync` routes it.
async fn run_routed(w: &World, sync: &Instance, job: &SubmitJob) {
    w.submit(job).await;
    for _ in 0..5 {
        w.advance(2);
    }
    let id = job.job_id.clone();
    sync.until("the job routed", |t| t.job(&id).is_some()).await;
}

/// A world with a runner (publishing the proxy events), a proxy-sync instance ready, and its bridges.
struct Stage {
    w: World,
    runner: TestRunner,
    sync: Instance,
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Stage {
    async fn start(label: &str) -> Self {
        let w = World::start(&format!("interactive-{label}"), |_| {}, |_| {}).await;
        let runner = w.runner("runner-a").await;
        runner.holds(4).await;
        let sync = support::start(&w, label).await;
        sync.until_ready().await;
        let (addr, stop) = bridges(&w, &sync).await;
        Self {
            w,
            runner,
            sync,
            addr,
            stop,
        }
    }

    async fn finish(self) {
        self.stop.cancel();
        self.sync.stop().await;
        self.runner.stop().await;
        self.w.close().await;
    }
}

/// The session bridges of an instance, on a free loopback port.
async fn bridges(w: &World, sync: &Instance) -> (SocketAddr, CancellationToken) {
    let bridges = Bridges::bind(
        "127.0.0.1:0",
        BridgeContext {
            routes: sync.routes.clone(),
            naming: HostNaming {
                prefix: w.config.pipeline.proxy.prefix.clone(),
                domain: w.config.pipeline.proxy.domain.clone(),
            },
            client: w.client.clone(),
            connect_timeout: Duration::from_secs(5),
            lifecycle_key: w.keys.lifecycle_state.clone(),
            origins: volcano_runner::sessions::origin::OriginPolicy::new(false, &[]),
            sessions: None,
        },
    )
    .await
    .expect("the bridges bind");
    let addr = bridges.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(bridges.run(stop.clone()));
    (addr, stop)
}

/// A WebSocket to `path` on the bridges, for the rank host of `job_id`/`rank`, as the proxy forwards it.
async fn open(addr: SocketAddr, w: &World, job_id: &str, rank: u32, path: &str) -> Socket {
    let host = format!(
        "{}{job_id}-{rank}.{}",
        w.config.pipeline.proxy.prefix, w.config.pipeline.proxy.domain
    );
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    request
        .headers_mut()
        .insert(http::header::HOST, host.parse().unwrap());
    // As a browser on the rank's own page names it.
    request.headers_mut().insert(
        http::header::ORIGIN,
        format!("http://{host}").parse().unwrap(),
    );
    let (socket, _) = tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request))
        .await
        .expect("the bridge answers")
        .expect("the bridge upgrades");
    socket
}

/// The next message, within patience.
/// Sends one command line to a terminal and reads its output until `expect` shows.
async fn run_in_terminal(socket: &mut Socket, command: &str, expect: &str) {
    socket
        .send(Message::binary(format!("{command}\n").into_bytes()))
        .await
        .unwrap();
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains(expect) {
        match next(socket).await {
            Some(Message::Binary(b)) => out.extend_from_slice(&b),
            Some(Message::Close(c)) => panic!(
                "closed early: {c:?}; output {:?}",
                String::from_utf8_lossy(&out)
            ),
            Some(_) => {}
            None => panic!("ended early: output {:?}", String::from_utf8_lossy(&out)),
        }
    }
}

/// Lets the simulated time of a cancelled job's end pass and returns the close frame the bridge sends.
async fn closed_as_the_job_ends(
    w: &World,
    socket: &mut Socket,
) -> tokio_tungstenite::tungstenite::protocol::CloseFrame {
    for _ in 0..4 {
        w.advance(5);
    }
    loop {
        match next(socket).await {
            Some(Message::Close(c)) => break c.expect("a close frame with a reason"),
            Some(_) => {}
            None => panic!("the socket ended without a close frame"),
        }
    }
}

async fn next(socket: &mut Socket) -> Option<Message> {
    tokio::time::timeout(PATIENCE, socket.next())
        .await
        .expect("a message within patience")
        .map(|m| m.expect("a well-formed message"))
}

/// Reads binary frames into `buf` until it holds `n` bytes.
async fn read_bytes(socket: &mut Socket, buf: &mut Vec<u8>, n: usize) -> Vec<u8> {
    while buf.len() < n {
        match next(socket).await {
            Some(Message::Binary(b)) => buf.extend_from_slice(&b),
            Some(Message::Close(c)) => panic!("closed while waiting for {n} bytes: {c:?}"),
            Some(_) => {}
            None => panic!("the socket ended while waiting for {n} bytes"),
        }
    }
    buf.drain(..n).collect()
}

fn pod_ip(w: &World, ns: &str, job_id: &str, rank: u32) -> String {
    let pod = w
        .pod(ns, &format!("j-{job_id}-job-{rank}"))
        .expect("the pod exists");
    pod["status"]["podIP"]
        .as_str()
        .expect("a pod IP")
        .to_owned()
}

/// A plain HTTP/1.0 GET; `Err` when nothing listens.
async fn http_get(ip: &str, port: u16) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect((ip, port)).await?;
    conn.write_all(b"GET / HTTP/1.0\r\nHost: app\r\n\r\n")
        .await?;
    let mut out = String::new();
    conn.read_to_string(&mut out).await?;
    Ok(out)
}

/// A 2-rank web job: each rank's pod has its own loopback IP and serves a page naming the job and the
/// rank there while it runs; once the job has ended, nothing answers there any more.
#[tokio::test]
async fn a_web_pod_serves_its_page_on_its_loopback_ip_while_running_and_not_after() {
    let w = World::start("interactive-web", |_| {}, |_| {}).await;
    let job = web_job("page", 2, "sleep 30");
    let ns = w.namespace_of(&job);
    w.submit(&job).await;
    for _ in 0..3 {
        w.advance(2);
    }
    let ips: Vec<String> = (0..2).map(|r| pod_ip(&w, &ns, "page", r)).collect();
    assert_ne!(ips[0], ips[1], "each pod has an IP of its own");
    for (rank, ip) in ips.iter().enumerate() {
        let addr: std::net::Ipv4Addr = ip.parse().unwrap();
        assert!(addr.is_loopback(), "{ip} is in 127/8");
        let page = http_get(ip, 8080).await.expect("the pod serves its page");
        assert!(
            page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"),
            "{page}"
        );
        assert!(
            page.contains(&format!("job j-page rank {rank}")),
            "rank {rank}'s page names its job and rank: {page}"
        );
    }
    // The program ends after 30 s: the pods are Succeeded and nothing listens any more.
    for _ in 0..4 {
        w.advance(10);
    }
    let phase = w
        .pod(&ns, "j-page-job-0")
        .map(|p| p["status"]["phase"].clone());
    assert_eq!(phase, Some(serde_json::json!("Succeeded")));
    // The listeners close as the simulator's tasks see the end (a connection made in that instant may
    // be reset); no page is served after the pod ended.
    for ip in &ips {
        let refused = async {
            loop {
                match http_get(ip, 8080).await {
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
                    Err(_) => tokio::task::yield_now().await,
                    Ok(page) => {
                        assert!(!page.contains("200"), "served after the pod ended: {page}")
                    }
                }
            }
        };
        tokio::time::timeout(PATIENCE, refused)
            .await
            .expect("nothing listens once the pod ended");
    }
    w.close().await;
}

/// noVNC's side, in the test: through the VNC bridge, the RFB 3.8 handshake with the rank's server
/// completes (version, security type None, ServerInit), and the desktop name names the job and rank.
#[tokio::test]
async fn a_vnc_session_through_the_bridge_completes_the_rfb_handshake() {
    let stage = Stage::start("vnc").await;
    let (w, sync, addr) = (&stage.w, &stage.sync, stage.addr);
    run_routed(w, sync, &vnc_job("desk", 2, "sleep 100000")).await;

    let mut socket = open(addr, w, "desk", 1, "/.volcano-runner/vnc").await;
    let mut buf = Vec::new();
    assert_eq!(
        read_bytes(&mut socket, &mut buf, 12).await,
        b"RFB 003.008\n"
    );
    socket
        .send(Message::binary(b"RFB 003.008\n".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        read_bytes(&mut socket, &mut buf, 2).await,
        [1, 1],
        "one security type: None"
    );
    socket.send(Message::binary(vec![1])).await.unwrap();
    assert_eq!(
        read_bytes(&mut socket, &mut buf, 4).await,
        [0, 0, 0, 0],
        "SecurityResult OK"
    );
    socket.send(Message::binary(vec![1])).await.unwrap();
    let init = read_bytes(&mut socket, &mut buf, 24).await;
    let (width, height) = (
        u16::from_be_bytes([init[0], init[1]]),
        u16::from_be_bytes([init[2], init[3]]),
    );
    assert!(width > 0 && height > 0);
    let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
    let name = String::from_utf8(read_bytes(&mut socket, &mut buf, name_len).await).unwrap();
    assert!(name.contains("job j-desk rank 1"), "{name}");
    socket.close(None).await.unwrap();

    // A host that is not routed gets no bridge.
    let host = "app-nosuchjob-0.cloud.sdu.dk";
    let mut request = format!("ws://{addr}/.volcano-runner/vnc")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert(http::header::HOST, host.parse().unwrap());
    let e = tokio_tungstenite::connect_async(request)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("404"), "{e}");
    stage.finish().await;
}

/// A terminal through the bridge runs a command in the rank's container (exec through kube-rs into the
/// simulator) and reads its output; when the job ends (its REMOVE reaches the instance), the terminal
/// is closed with a reason saying so.
#[tokio::test]
async fn a_terminal_session_runs_a_command_and_is_closed_when_the_job_ends() {
    let stage = Stage::start("term").await;
    let (w, sync, addr) = (&stage.w, &stage.sync, stage.addr);
    let job = web_job("shell", 1, "sleep 100000");
    let ns = w.namespace_of(&job);
    run_routed(w, sync, &job).await;

    let mut socket = open(addr, w, "shell", 0, "/.volcano-runner/terminal").await;
    run_in_terminal(
        &mut socket,
        "echo \"answer-$((6 * 7)) in $HOSTNAME\"",
        "answer-42 in j-shell-job-0",
    )
    .await;

    cancel(w, &ns, "shell").await;
    let close = closed_as_the_job_ends(w, &mut socket).await;
    assert_eq!(close.code, CloseCode::Normal);
    assert_eq!(close.reason.as_str(), "job shell ended");
    stage.finish().await;
}

/// A TERMINAL application without a web port is routed to the bridges only (port 0 in the route its
/// event made, its pods' own IPs kept for the exec): its terminal runs a command, there is no VNC server
/// to bridge to, and the terminal is closed when the job is cancelled, with the reason.
#[tokio::test]
async fn a_terminal_only_job_gets_a_shell_and_no_vnc_and_the_shell_closes_when_cancelled() {
    let stage = Stage::start("term-only").await;
    let (w, sync, addr) = (&stage.w, &stage.sync, stage.addr);
    let job = terminal_job("tonly", 2, "sleep 100000");
    let ns = w.namespace_of(&job);
    run_routed(w, sync, &job).await;
    let ips = support::pod_ips(w, &ns, "tonly", 2);
    let routed = sync.routes.read(|t| t.job("tonly").cloned()).unwrap();
    for (rank, b) in &routed.ranks {
        assert!(b.bridges_only(), "{b}");
        assert_eq!(b.ip.to_string(), ips[*rank as usize]);
    }

    let mut socket = open(addr, w, "tonly", 1, "/.volcano-runner/terminal").await;
    run_in_terminal(
        &mut socket,
        "echo \"hello-$((40 + 2)) in $HOSTNAME\"",
        "hello-42 in j-tonly-job-1",
    )
    .await;

    let mut vnc = open(addr, w, "tonly", 0, "/.volcano-runner/vnc").await;
    match next(&mut vnc).await {
        Some(Message::Close(Some(c))) => {
            assert_eq!(c.code, CloseCode::Error);
            assert!(c.reason.contains("no VNC server"), "{c:?}");
        }
        other => panic!("a VNC bridge to a terminal-only job: {other:?}"),
    }

    cancel(w, &ns, "tonly").await;
    let close = closed_as_the_job_ends(w, &mut socket).await;
    assert_eq!(close.code, CloseCode::Normal);
    assert_eq!(close.reason.as_str(), "job tonly ended");
    stage.finish().await;
}

/// The logs bridge of a 2-rank job: both ranks' lines, live as simulated time passes, in time order
/// (by time, then rank), each with its rank; the socket is closed when the job's programs have ended.
#[tokio::test]
async fn the_logs_bridge_streams_both_ranks_lines_in_time_order_and_ends_with_the_job() {
    let stage = Stage::start("logs").await;
    let (w, sync, addr) = (&stage.w, &stage.sync, stage.addr);
    let job = web_job(
        "chatty",
        2,
        "echo first; sleep 20; echo second; sleep 20; echo third; sleep 20",
    );
    run_routed(w, sync, &job).await;

    let mut socket = open(addr, w, "chatty", 1, "/.volcano-runner/logs").await;
    let mut lines: Vec<serde_json::Value> = Vec::new();
    let mut advanced = 0;
    let close = loop {
        let msg = tokio::select! {
            m = next(&mut socket) => m,
            () = tokio::time::sleep(Duration::from_millis(300)), if advanced < 20 => {
                advanced += 1;
                w.advance(5);
                continue;
            }
        };
        match msg {
            Some(Message::Text(t)) => lines.push(serde_json::from_str(t.as_str()).unwrap()),
            Some(Message::Close(c)) => break c.expect("a close frame with a reason"),
            Some(_) => {}
            None => panic!("the socket ended without a close frame"),
        }
    };
    assert_eq!(close.code, CloseCode::Normal);
    assert!(
        close.reason.as_str().starts_with("job chatty ended"),
        "{close:?}"
    );
    let seen: Vec<(u64, String)> = lines
        .iter()
        .map(|l| {
            (
                l["rank"].as_u64().unwrap(),
                l["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for rank in 0..2 {
        let of_rank: Vec<&str> = seen
            .iter()
            .filter(|(r, _)| *r == rank)
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(
            of_rank,
            ["first", "second", "third"],
            "rank {rank}: {seen:?}"
        );
    }
    let keys: Vec<(jiff::Timestamp, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["at"].as_str().unwrap().parse().unwrap(),
                l["rank"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "in time order, then by rank: {seen:?}");
    stage.finish().await;
}
