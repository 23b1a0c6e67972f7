//! Sessions that another tenant cannot use, deny or outlive (issue 40), through a real Caddy whose every
//! request proxy-sync's `/authz` checks and whose `/.volcano-runner/` paths go to proxy-sync's bridges,
//! with jobs the simulator runs, sessions issued over real RabbitMQ, and headless Chromium as the
//! user's browser. Every job's page is same-site to every other's (one parent domain): these tests
//! play a co-tenant's page against a victim's sessions.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use volcano_runner::messages::v1::SessionKind;
use volcano_runner::proxy::bridge::{BridgeContext, Bridges, LOGS_PATH, TERMINAL_PATH, VNC_PATH};
use volcano_runner::proxy::{HostNaming, ProxySyncConfig};
use volcano_runner::sessions::check::{CheckSettings, SessionCheck};
use volcano_runner::sessions::origin::OriginPolicy;
use volcano_runner::sessions::record::name_for;
use volcano_runner::sessions::token::{self, Hash};

use crate::cdp::{Chrome, websocket_probe};
use crate::interactive::{terminal_job, vnc_job};
use crate::live::{COOKIE, Caddy};
use crate::monitor_support::{PATIENCE, TestRunner, World, web_job};
use crate::ports::free_port;
use crate::sessions::{
    Requester, RunningIssuer, issuer, requester, sim_clock, token_of, until_known,
};
use crate::support::{self, Instance};

/// The orchestrator's web frontend, listed in `[sessions] allowed_origins`.
const FRONTEND: &str = "http://frontend.example";

/// A world with jobs running and routed in Caddy, the check and the bridges as proxy-sync serves them
/// (plain http, as Chromium keeps no `Secure` cookie from http), an issuer and the orchestrator.
struct Stage {
    w: World,
    runner: TestRunner,
    caddy: Caddy,
    instance: Instance,
    check: SessionCheck,
    bridges: JoinHandle<()>,
    shutdown: CancellationToken,
    issuer: RunningIssuer,
    orchestrator: Requester,
    naming: HostNaming,
}

impl Stage {
    /// Runs one-rank web, VNC and terminal jobs of these ids.
    async fn start(label: &str, web: &[&str], vnc: &[&str], terminal: &[&str]) -> Stage {
        let mut w = World::start(label, |c| c.sessions.scheme = "http".into(), |_| {}).await;
        let runner = w.runner("runner-a").await;
        runner.holds(4).await;
        for id in web {
            w.submit(&web_job(id, 1, "sleep 100000")).await;
        }
        for id in vnc {
            w.submit(&vnc_job(id, 1, "sleep 100000")).await;
        }
        for id in terminal {
            w.submit(&terminal_job(id, 1, "sleep 100000")).await;
        }
        for _ in 0..4 {
            w.advance(2);
        }
        let all: Vec<String> = web
            .iter()
            .chain(vnc)
            .chain(terminal)
            .map(|id| (*id).to_owned())
            .collect();
        w.until("a CREATE for every job", |s| {
            all.iter().all(|id| s.proxy.iter().any(|p| &p.job_id == id))
        })
        .await;
        let caddy = Caddy::start().await;
        let (authz_port, bridge_port) = (free_port(), free_port());
        let instance = support::start_configured(&w, label, w.config.broker.clone(), |c| {
            c.caddy_admin = caddy.admin_url.clone();
            c.listen_port = caddy.http_port;
            c.authz_url = format!("http://127.0.0.1:{authz_port}/authz");
            c.bridge_url = format!("http://127.0.0.1:{bridge_port}");
        })
        .await;
        instance.until_ready().await;
        let naming = HostNaming {
            prefix: w.config.pipeline.proxy.prefix.clone(),
            domain: w.config.pipeline.proxy.domain.clone(),
        };
        let shutdown = CancellationToken::new();
        let check = SessionCheck::start(
            w.client.clone(),
            instance.routes.clone(),
            CheckSettings {
                namespace: w.config.cluster.namespace.clone(),
                naming: naming.clone(),
                secure: false,
                allowed_origins: vec![FRONTEND.to_owned()],
                clock: sim_clock(&w),
                metrics: None,
            },
            &ProxySyncConfig {
                authz_listen: format!("127.0.0.1:{authz_port}"),
                ..ProxySyncConfig::default()
            },
            None,
            shutdown.clone(),
        )
        .await
        .expect("the check binds");
        let bridges = Bridges::bind(
            &format!("127.0.0.1:{bridge_port}"),
            BridgeContext {
                routes: instance.routes.clone(),
                naming: naming.clone(),
                client: w.client.clone(),
                connect_timeout: Duration::from_secs(5),
                lifecycle_key: w.keys.lifecycle_state.clone(),
                origins: OriginPolicy::new(false, &[FRONTEND.to_owned()]),
                sessions: Some(check.authz.clone()),
            },
        )
        .await
        .expect("the bridges bind");
        let bridges = tokio::spawn(bridges.run(shutdown.clone()));
        // Caddy routes by the check's answer: a job is routed behind it once the table has it.
        instance
            .until("every job routed", |t| {
                all.iter().all(|id| t.job(id).is_some())
            })
            .await;
        let issuer = issuer(&w).await;
        let orchestrator = requester(&w).await;
        Stage {
            w,
            runner,
            caddy,
            instance,
            check,
            bridges,
            shutdown,
            issuer,
            orchestrator,
            naming,
        }
    }

    fn host(&self, job_id: &str) -> String {
        self.naming.rank_host(job_id, 0)
    }

    /// A session of rank 0 of `job_id`, known to the check; its id.
    async fn session(
        &mut self,
        job_id: &str,
        kind: SessionKind,
        lifetime_s: Option<i64>,
    ) -> String {
        let reply = self
            .orchestrator
            .open(&self.w, job_id, 0, kind, lifetime_s)
            .await;
        let host = self.host(job_id);
        let id = token_of(&reply, &host);
        until_known(&self.check, &host, &id).await;
        id
    }

    async fn stop(self) {
        self.orchestrator.close().await;
        self.shutdown.cancel();
        self.check.join().await;
        let _ = self.bridges.await;
        self.instance.stop().await;
        self.issuer.kill().await;
        self.runner.stop().await;
        self.w.close().await;
    }
}

fn session_path(id: &str) -> String {
    format!("/.volcano-runner/session?token={id}")
}

/// A raw WebSocket upgrade through Caddy to `host`'s `path`, with these extra headers: the status.
async fn upgrade(port: u16, host: &str, path: &str, extra: &[(&str, &str)]) -> u16 {
    let mut headers = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    headers.extend_from_slice(extra);
    request(port, host, "GET", path, &headers).await
}

/// One raw HTTP/1.1 request through Caddy to `host` (with the proxy's port, as a browser names it):
/// the status.
async fn request(port: u16, host: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("Caddy accepts");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if method != "GET" {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    tokio::time::timeout(PATIENCE, reader.read_line(&mut status))
        .await
        .expect("Caddy answers")
        .unwrap();
    status
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {status:?}"))
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A terminal through Caddy, from the rank's own page (its Origin), with the session's cookie.
async fn open_terminal(port: u16, host: &str, id: &str) -> Socket {
    let mut request = format!("ws://127.0.0.1:{port}{TERMINAL_PATH}")
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert(
        http::header::HOST,
        format!("{host}:{port}").parse().unwrap(),
    );
    headers.insert(
        http::header::COOKIE,
        format!("{COOKIE}-terminal={id}").parse().unwrap(),
    );
    headers.insert(
        http::header::ORIGIN,
        format!("http://{host}:{port}").parse().unwrap(),
    );
    let (socket, answer) =
        tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request))
            .await
            .expect("Caddy answers")
            .expect("the terminal opens");
    assert_eq!(answer.status(), 101);
    socket
}

/// Runs `command` in an open terminal and waits for `expect` in its output.
async fn run(socket: &mut Socket, command: &str, expect: &str) {
    socket
        .send(Message::binary(format!("{command}\n").into_bytes()))
        .await
        .unwrap();
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains(expect) {
        match tokio::time::timeout(PATIENCE, socket.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => out.extend_from_slice(&b),
            Ok(Some(Ok(Message::Close(c)))) => panic!("closed early: {c:?}"),
            Ok(Some(Ok(_))) => {}
            other => panic!(
                "no {expect:?} in {:?}: {other:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// Waits for the terminal's close frame and returns its reason.
async fn closed(socket: &mut Socket) -> String {
    loop {
        match tokio::time::timeout(PATIENCE, socket.next()).await {
            Ok(Some(Ok(Message::Close(Some(frame))))) => return frame.reason.to_string(),
            Ok(Some(Ok(_))) => {}
            other => panic!("the terminal ended without a close frame: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------------

/// The issue's remote shell: a victim holding terminal and desktop sessions of job T visits job B's
/// page, whose script opens T's terminal, VNC and logs bridges with the victim's cookies: each is
/// refused. The victim's own page of T opens its terminal (a command runs) and its desktop (the RFB
/// greeting arrives).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_a_co_tenant_page_cannot_open_a_victims_bridges_and_the_victims_own_page_can() {
    let mut s = Stage::start("hijack-browser", &["hb"], &["ht"], &[]).await;
    let (t, b) = (s.host("ht"), s.host("hb"));
    let terminal = s.session("ht", SessionKind::Terminal, None).await;
    let vnc = s.session("ht", SessionKind::Vnc, None).await;
    // B's own web session, which its owner hands out as a link.
    let lure = s.session("hb", SessionKind::Web, None).await;
    let mut chrome = Chrome::start(&s.naming.domain, s.caddy.http_port).await;
    let ws = |path: &str| format!("ws://{t}:{}{path}", s.caddy.http_port);

    // The victim opens both sessions (the orchestrator's URLs).
    chrome.goto(&chrome.url(&t, &session_path(&vnc))).await;
    chrome.goto(&chrome.url(&t, &session_path(&terminal))).await;
    let own = chrome
        .eval(&websocket_probe(
            &ws(TERMINAL_PATH),
            "echo own-$HOSTNAME\n",
            "own-j-ht-job-0",
        ))
        .await;
    assert!(
        own.as_str().is_some_and(|o| o.starts_with("terminal:")),
        "the victim's own terminal: {own}"
    );
    let own = chrome.eval(&websocket_probe(&ws(VNC_PATH), "", "")).await;
    assert!(
        own.as_str()
            .is_some_and(|o| o.starts_with("bytes:RFB 003.008")),
        "the victim's own desktop: {own}"
    );

    // B's owner hands the victim a session URL of B (a link to their notebook, say); B's page's
    // script tries T's bridges with the victim's cookies.
    chrome.goto(&chrome.url(&b, &session_path(&lure))).await;
    let title = chrome.eval("document.title").await;
    assert!(
        title.as_str().is_some_and(|t| t.contains("hb")),
        "job B's page: {title}"
    );
    let origin = chrome.eval("location.origin").await;
    assert_eq!(origin, chrome.origin(&b).as_str());
    for path in [TERMINAL_PATH, VNC_PATH, LOGS_PATH] {
        let got = chrome
            .eval(&websocket_probe(
                &ws(path),
                "echo pwned-$HOSTNAME\n",
                "pwned-j",
            ))
            .await;
        assert_eq!(got, "refused", "job B's page opened T's {path}");
    }

    // Back on T's own page, the terminal still opens.
    chrome
        .goto(&chrome.url(&t, "/.volcano-runner/terminal"))
        .await;
    let own = chrome
        .eval(&websocket_probe(
            &ws(TERMINAL_PATH),
            "echo again-$HOSTNAME\n",
            "again-j-ht-job-0",
        ))
        .await;
    assert!(
        own.as_str().is_some_and(|o| o.starts_with("terminal:")),
        "{own}"
    );
    drop(chrome);
    s.stop().await;
}

/// Raw upgrades to every bridge, with the victim's valid cookies: a foreign `Origin`, another job's,
/// none and `null` are refused (by the check, before the bridge); the rank's own origin and the listed
/// frontend are let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_upgrades_need_the_ranks_own_origin_or_a_listed_one() {
    let mut s = Stage::start("hijack-raw", &["rb"], &["ro"], &[]).await;
    let (t, b) = (s.host("ro"), s.host("rb"));
    let terminal = s.session("ro", SessionKind::Terminal, None).await;
    let vnc = s.session("ro", SessionKind::Vnc, None).await;
    let port = s.caddy.http_port;
    let cookie = format!("{COOKIE}-terminal={terminal}; {COOKIE}-vnc={vnc}; theme=dark");
    let t_origin = format!("http://{t}:{port}");
    let b_origin = format!("http://{b}:{port}");
    for path in [TERMINAL_PATH, VNC_PATH, LOGS_PATH] {
        for origin in [
            Some("https://evil.example"),
            Some(b_origin.as_str()),
            Some("null"),
            None,
        ] {
            let mut extra = vec![("Cookie", cookie.as_str())];
            if let Some(origin) = origin {
                extra.push(("Origin", origin));
            }
            let status = upgrade(port, &t, path, &extra).await;
            assert_eq!(status, 403, "{path} from {origin:?}");
        }
        for origin in [t_origin.as_str(), FRONTEND] {
            let status = upgrade(port, &t, path, &[("Cookie", &cookie), ("Origin", origin)]).await;
            assert_eq!(status, 101, "{path} from {origin}");
        }
    }
    // A state-changing request (a form post, a fetch) to job B's page with B's web session: from
    // another page it is refused, from B's own page or the frontend it reaches the pod.
    let web = s.session("rb", SessionKind::Web, None).await;
    let cookie = format!("{COOKIE}-web={web}");
    for (origin, want) in [
        (Some(t_origin.as_str()), 403),
        (Some("null"), 403),
        (None, 403),
        (Some(b_origin.as_str()), 200),
        (Some(FRONTEND), 200),
    ] {
        let mut headers = vec![("Cookie", cookie.as_str())];
        if let Some(origin) = origin {
            headers.push(("Origin", origin));
        }
        let status = request(port, &b, "POST", "/api/contents", &headers).await;
        assert_eq!(status, want, "POST to B from {origin:?}");
    }
    // Reading it is a top-level navigation from anywhere; a frame of it on another page is not.
    let navigate = [
        ("Cookie", cookie.as_str()),
        ("Sec-Fetch-Site", "same-site"),
        ("Sec-Fetch-Mode", "navigate"),
    ];
    let mut top = navigate.to_vec();
    top.push(("Sec-Fetch-Dest", "document"));
    assert_eq!(request(port, &b, "GET", "/", &top).await, 200);
    let mut framed = navigate.to_vec();
    framed.push(("Sec-Fetch-Dest", "iframe"));
    assert_eq!(request(port, &b, "GET", "/", &framed).await, 403);
    let image = [
        ("Cookie", cookie.as_str()),
        ("Sec-Fetch-Site", "same-site"),
        ("Sec-Fetch-Mode", "no-cors"),
        ("Sec-Fetch-Dest", "image"),
    ];
    assert_eq!(request(port, &b, "GET", "/", &image).await, 403);
    s.stop().await;
}

/// Web, VNC and terminal sessions of one rank each, used alternately in one browser profile: none
/// replaces another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_every_kind_coexist_on_a_rank_in_one_browser() {
    let mut s = Stage::start("hijack-coexist", &["cw"], &["cv"], &[]).await;
    let (web, desk) = (s.host("cw"), s.host("cv"));
    let port = s.caddy.http_port;
    let web_session = s.session("cw", SessionKind::Web, None).await;
    let web_terminal = s.session("cw", SessionKind::Terminal, None).await;
    let vnc_session = s.session("cv", SessionKind::Vnc, None).await;
    let vnc_terminal = s.session("cv", SessionKind::Terminal, None).await;
    let mut chrome = Chrome::start(&s.naming.domain, port).await;
    let ws = |host: &str, path: &str| format!("ws://{host}:{port}{path}");

    chrome
        .goto(&chrome.url(&web, &session_path(&web_session)))
        .await;
    assert_eq!(chrome.fetch_status("/").await, 200);
    chrome
        .goto(&chrome.url(&web, &session_path(&web_terminal)))
        .await;
    chrome
        .goto(&chrome.url(&desk, &session_path(&vnc_session)))
        .await;
    chrome
        .goto(&chrome.url(&desk, &session_path(&vnc_terminal)))
        .await;

    for round in 0..2 {
        // The web job: its page and its terminal.
        chrome.goto(&chrome.url(&web, "/lab")).await;
        let title = chrome.eval("document.title").await;
        assert!(
            title.as_str().is_some_and(|t| t.contains("cw")),
            "round {round}: the web page: {title}"
        );
        assert_eq!(chrome.fetch_status("/api").await, 200, "round {round}");
        let got = chrome
            .eval(&websocket_probe(
                &ws(&web, TERMINAL_PATH),
                "echo web-$HOSTNAME\n",
                "web-j-cw-job-0",
            ))
            .await;
        assert!(
            got.as_str().is_some_and(|o| o.starts_with("terminal:")),
            "round {round}: the web job's terminal: {got}"
        );
        // The VNC job: its desktop and its terminal.
        chrome
            .goto(&chrome.url(&desk, "/.volcano-runner/vnc"))
            .await;
        let got = chrome
            .eval(&websocket_probe(&ws(&desk, VNC_PATH), "", ""))
            .await;
        assert!(
            got.as_str()
                .is_some_and(|o| o.starts_with("bytes:RFB 003.008")),
            "round {round}: the desktop: {got}"
        );
        let got = chrome
            .eval(&websocket_probe(
                &ws(&desk, TERMINAL_PATH),
                "echo desk-$HOSTNAME\n",
                "desk-j-cv-job-0",
            ))
            .await;
        assert!(
            got.as_str().is_some_and(|o| o.starts_with("terminal:")),
            "round {round}: the VNC job's terminal: {got}"
        );
    }
    drop(chrome);
    s.stop().await;
}

/// A co-tenant page plants session cookies for the parent domain, with longer paths (sent first) and
/// both names, holding its own job's valid session and forged ids: the victim's pages keep answering
/// 200, at the root and at deep paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_tossing_from_a_co_tenant_page_leaves_the_victims_pages_answering() {
    let mut s = Stage::start("hijack-toss", &["tv", "ta"], &[], &[]).await;
    let (victim, attacker) = (s.host("tv"), s.host("ta"));
    let victim_session = s.session("tv", SessionKind::Web, None).await;
    let attacker_session = s.session("ta", SessionKind::Web, None).await;
    let mut chrome = Chrome::start(&s.naming.domain, s.caddy.http_port).await;

    chrome
        .goto(&chrome.url(&victim, &session_path(&victim_session)))
        .await;
    assert_eq!(chrome.fetch_status("/deep/er/page").await, 200);

    // The attacker's page, in the victim's browser (through a session URL the attacker handed out).
    chrome
        .goto(&chrome.url(&attacker, &session_path(&attacker_session)))
        .await;
    let forged = token::generate().unwrap();
    let script = format!(
        r#"(() => {{
            const names = ['{COOKIE}', '{COOKIE}-web', '{COOKIE}-terminal'];
            const values = [{attacker_session:?}, {forged:?}];
            // Five paths longer than the user's own cookie's `/`: sent before it to /deep/er/page.
            const paths = ['/deep/er/page', '/deep/er/', '/deep/er', '/deep/', '/deep', '/'];
            let n = 0;
            for (const name of names) for (const path of paths) for (const value of values) {{
                document.cookie = `${{name}}=${{value}}; domain={domain}; path=${{path}}`;
                n++;
            }}
            return n;
        }})()"#,
        domain = s.naming.domain,
    );
    assert_eq!(chrome.eval(&script).await, 36);

    let planted = chrome.eval("document.cookie").await;
    assert_eq!(
        planted
            .as_str()
            .map(|c| c.matches("ucloud-compute-session").count()),
        Some(3),
        "the planted cookies of path / (one per name): {planted}"
    );

    // The victim's pages, root and deep: the browser sends the planted cookies with them, those of
    // the longer paths first.
    chrome.goto(&chrome.url(&victim, "/")).await;
    let title = chrome.eval("document.title").await;
    assert!(
        title.as_str().is_some_and(|t| t.contains("tv")),
        "the victim's page: {title}"
    );
    for path in [
        "/deep/er/page",
        "/deep/er/page/more",
        "/deep/er",
        "/deep",
        "/",
    ] {
        assert_eq!(chrome.fetch_status(path).await, 200, "{path}");
    }
    drop(chrome);
    s.stop().await;
}

/// A terminal opened with a 60-second session is closed when the session expires (on the check's
/// clock, the simulator's), and one whose session record is deleted is closed as revoked; the job goes
/// on running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_closes_when_its_session_expires_or_is_revoked() {
    let mut s = Stage::start("hijack-expiry", &[], &[], &["te"]).await;
    let host = s.host("te");
    let port = s.caddy.http_port;
    let short = s.session("te", SessionKind::Terminal, Some(60)).await;
    let long = s.session("te", SessionKind::Terminal, None).await;

    let mut socket = open_terminal(port, &host, &short).await;
    run(&mut socket, "echo short-$HOSTNAME", "short-j-te-job-0").await;
    s.w.advance(30);
    run(&mut socket, "echo still-$HOSTNAME", "still-j-te-job-0").await;
    s.w.advance(31);
    assert_eq!(closed(&mut socket).await, "the session expired");
    // A new upgrade with it is refused.
    let status = upgrade(
        port,
        &host,
        TERMINAL_PATH,
        &[
            ("Cookie", &format!("{COOKIE}-terminal={short}")),
            ("Origin", &format!("http://{host}:{port}")),
        ],
    )
    .await;
    assert_eq!(status, 403);

    // The long session's terminal runs until its record is deleted.
    let mut socket = open_terminal(port, &host, &long).await;
    run(&mut socket, "echo long-$HOSTNAME", "long-j-te-job-0").await;
    let records: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(s.w.client.clone(), &s.w.config.cluster.namespace);
    records
        .delete(&name_for(&Hash::of(&long)), &Default::default())
        .await
        .expect("the record is deleted");
    assert_eq!(closed(&mut socket).await, "the session was revoked");
    s.stop().await;
}
