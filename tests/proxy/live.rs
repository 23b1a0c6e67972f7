//! What the live tests run beside proxy-sync: a real Caddy (Debian's `caddy`, a process of the test's
//! with its admin API on a free loopback port, never the system service), small HTTP servers on loopback
//! addresses standing in for the pods, the session check and the bridges (each answering who it is and
//! what it was asked, and counting its requests), a plain HTTP/1.1 client that talks to Caddy with any
//! Host header, and headless Chromium ([`Browser`]) opening pages through Caddy.
//!
//! scripts/test installs `caddy` and `chromium`; a test that finds one missing fails saying so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use volcano_runner::config::proxy_sync::Upstream;
use volcano_runner::proxy::caddy::{self, CaddyAdmin};

use crate::monitor_support::PATIENCE;

/// The session cookie (the original's name).
pub const COOKIE: &str = "ucloud-compute-session";

use crate::ports::free_port;

/// An empty directory of its own under the temporary directory.
fn fresh_dir(label: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vr-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn which(program: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("{program} is not installed: scripts/test installs it (apt-get install {program})")
    })
}

/// A Caddy process of the test's. Killed (SIGKILL) when dropped.
pub struct Caddy {
    pub admin_url: String,
    pub admin: CaddyAdmin,
    /// The port proxy-sync is told to listen on (`[proxy_sync] listen_port`).
    pub http_port: u16,
    child: Child,
    dir: PathBuf,
}

impl Caddy {
    /// Starts Caddy with nothing but its admin API, on a free port, and waits until it answers.
    pub async fn start() -> Self {
        let admin_port = free_port();
        let http_port = free_port();
        let dir = fresh_dir("caddy");
        let mut caddy = Self {
            admin_url: format!("http://127.0.0.1:{admin_port}"),
            admin: CaddyAdmin::new(
                Upstream::parse(&format!("http://127.0.0.1:{admin_port}")).unwrap(),
            ),
            http_port,
            child: Self::spawn(&dir, admin_port),
            dir,
        };
        caddy.until_up().await;
        caddy
    }

    fn spawn(dir: &std::path::Path, admin_port: u16) -> Child {
        let config = dir.join("initial.json");
        let initial = serde_json::json!({
            "admin": {"listen": format!("127.0.0.1:{admin_port}"), "config": {"persist": false}},
        });
        std::fs::write(&config, initial.to_string()).unwrap();
        Command::new(which("caddy"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            // Its own data and config directories: never the system service's.
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("caddy starts")
    }

    async fn until_up(&mut self) {
        let wait = async {
            loop {
                if self.admin.config().await.is_ok() {
                    return;
                }
                assert!(
                    self.child.try_wait().unwrap().is_none(),
                    "caddy exited at start"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .expect("caddy's admin API answers");
    }

    /// kill -9, then a fresh Caddy on the same ports, with no routes.
    pub async fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let admin_port = self.admin_url.rsplit(':').next().unwrap().parse().unwrap();
        self.child = Self::spawn(&self.dir, admin_port);
        self.until_up().await;
    }

    /// Host → where its other paths go, as Caddy runs it now. (Caddy replaces its admin listener when a
    /// configuration is loaded, which can reset a read at that moment: it is read again.)
    pub async fn hosts(&self) -> std::collections::BTreeMap<String, String> {
        let mut tries = 0;
        loop {
            match self.admin.config().await {
                Ok(config) => return caddy::live_hosts(&config),
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %e, "Reading Caddy's configuration again.");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("caddy's config reads: {e}"),
            }
        }
    }

    /// Waits until Caddy's live routes satisfy `done`.
    pub async fn until(
        &self,
        what: &str,
        done: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
    ) {
        let wait = async {
            while !done(&self.hosts().await) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(PATIENCE, wait).await.is_err() {
            panic!(
                "timed out waiting for {what}; Caddy routes {:?}",
                self.hosts().await
            );
        }
    }
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A request as a [`Server`] received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How a [`Server`] answers.
#[derive(Clone)]
pub enum Role {
    /// A pod: a page naming the job and rank; a WebSocket upgrade is accepted and echoes what it gets.
    Pod { job: String, rank: u32 },
    /// The bridges: names itself, the host and the path.
    Bridge,
    /// The session check of the interface: for a host in its table, 200 with the job's headers, the
    /// host's upstream and the cookies without the session's for the cookie `good`, the session path
    /// answered with a 302 setting the cookie, 401 without a cookie, 403 otherwise; 404 for a host not
    /// in its table (the real check's answers, with a table the test keeps).
    Authz(Upstreams),
}

/// The fake check's table: host → the upstream it names.
pub type Upstreams = Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>;

/// A small HTTP/1.1 server on a loopback address.
pub struct Server {
    pub addr: SocketAddr,
    pub seen: Arc<std::sync::Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// A pod of job `job`: rank `rank` on `ip`.
    pub async fn pod(ip: &str, job: &str, rank: u32) -> Self {
        Self::start(
            ip,
            Role::Pod {
                job: job.into(),
                rank,
            },
        )
        .await
    }

    /// Serves `role` on `ip` (any of 127.0.0.0/8), on a free port.
    pub async fn start(ip: &str, role: Role) -> Self {
        let listener = TcpListener::bind((ip, 0))
            .await
            .expect("a loopback address");
        let addr = listener.local_addr().unwrap();
        let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (role, log) = (role.clone(), log.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, role, log).await;
                });
            }
        });
        Self { addr, seen, task }
    }

    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }
}

async fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Seen>> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).await?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
    }
    Ok(Some(Seen { target, headers }))
}

async fn serve(
    stream: TcpStream,
    role: Role,
    log: Arc<std::sync::Mutex<Vec<Seen>>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    while let Some(req) = read_head(&mut reader).await? {
        log.lock().unwrap().push(req.clone());
        let host = req.header("host").unwrap_or_default().to_owned();
        let upgrade = req
            .header("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let (status, extra, body) = match &role {
            Role::Pod { .. } if upgrade => {
                // The proxy only needs the 101 and the Upgrade header; after it, bytes are opaque.
                reader
                    .get_mut()
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                    .await?;
                let mut buf = vec![0; 4096];
                loop {
                    let n = reader.read(&mut buf).await?;
                    if n == 0 {
                        return Ok(());
                    }
                    reader.get_mut().write_all(&buf[..n]).await?;
                }
            }
            Role::Pod { job, rank } => (
                "200 OK",
                String::new(),
                format!(
                    "<html><head><title>job {job} rank {rank}</title></head><body><h1 id=\"who\">job {job} rank {rank}</h1><p id=\"path\">{}</p></body></html>",
                    req.target
                ),
            ),
            Role::Bridge => (
                "200 OK",
                String::new(),
                format!("bridge {host} {}", req.target),
            ),
            Role::Authz(upstreams) => authz(&req, upstreams),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n{extra}\r\n",
            body.len()
        );
        let out = reader.get_mut();
        out.write_all(head.as_bytes()).await?;
        out.write_all(body.as_bytes()).await?;
    }
    Ok(())
}

fn authz(req: &Seen, upstreams: &Upstreams) -> (&'static str, String, String) {
    let host = req
        .header("x-forwarded-host")
        .or(req.header("host"))
        .unwrap_or_default();
    let Some(upstream) = upstreams.lock().unwrap().get(host).cloned() else {
        return ("404 Not Found", String::new(), "not routed\n".into());
    };
    let uri = req
        .header("x-forwarded-uri")
        .map(str::to_owned)
        .unwrap_or_else(|| {
            req.target
                .strip_prefix("/authz")
                .unwrap_or(&req.target)
                .to_owned()
        });
    if let Some(token) = uri.strip_prefix("/.volcano-runner/session?token=") {
        return (
            "302 Found",
            format!(
                "Set-Cookie: {COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax\r\nLocation: /\r\n"
            ),
            String::new(),
        );
    }
    let cookie = req.header("cookie").and_then(|c| {
        c.split(';')
            .filter_map(|p| p.trim().split_once('='))
            .find(|(n, _)| *n == COOKIE)
            .map(|(_, v)| v.to_owned())
    });
    match cookie.as_deref() {
        None => ("401 Unauthorized", String::new(), "no session\n".into()),
        Some("good") => {
            let kept: Vec<&str> = req
                .header("cookie")
                .unwrap_or_default()
                .split(';')
                .map(str::trim)
                .filter(|p| !p.is_empty() && !p.starts_with(&format!("{COOKIE}=")))
                .collect();
            (
                "200 OK",
                format!(
                    "X-Volcano-Runner-Job: checked\r\nX-Volcano-Runner-Rank: 0\r\nX-Volcano-Runner-Upstream: {upstream}\r\nX-Volcano-Runner-Cookie: {}\r\n",
                    kept.join("; ")
                ),
                String::new(),
            )
        }
        Some(_) => ("403 Forbidden", String::new(), "wrong session\n".into()),
    }
}

/// An HTTP/1.1 answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` to `127.0.0.1:port` with `Host: host` and the given extra header lines.
pub async fn get(port: u16, host: &str, path: &str, extra: &[(&str, &str)]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the proxy listens");
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (n, v) in extra {
        request.push_str(&format!("{n}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut text))
        .await
        .expect("the proxy answers")
        .unwrap();
    let text = String::from_utf8_lossy(&text).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// Sends a WebSocket upgrade through the proxy (`Upgrade: websocket` on `path` of `host`, with `extra`
/// headers) and reads the answer's head: its status and the connection, positioned after the head.
pub async fn upgrade_head(
    port: u16,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> (u16, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    for (n, v) in extra {
        request.push_str(&format!("{n}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await.unwrap();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {status_line:?}"));
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).await.unwrap();
        if h.trim_end().is_empty() {
            break;
        }
    }
    (status, reader)
}

/// Opens a WebSocket through the proxy ([`upgrade_head`]), sends `payload` after the 101 and returns
/// the status and what came back.
pub async fn websocket_echo(
    port: u16,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
    payload: &[u8],
) -> (u16, Vec<u8>) {
    let (status, mut reader) = upgrade_head(port, host, path, extra).await;
    if status != 101 {
        return (status, Vec::new());
    }
    reader.get_mut().write_all(payload).await.unwrap();
    let mut back = vec![0; payload.len()];
    tokio::time::timeout(PATIENCE, reader.read_exact(&mut back))
        .await
        .expect("the echo comes back through the proxy")
        .unwrap();
    (status, back)
}

/// What headless Chromium got for a URL: the HTTP statuses of the page's main request in order
/// (redirects first, from Chromium's network log) and the DOM it rendered.
#[derive(Debug)]
pub struct Page {
    pub statuses: Vec<u16>,
    pub dom: String,
}

/// Headless Chromium that resolves every host under `domain` to the proxy on loopback.
pub struct Browser {
    pub domain: String,
    pub proxy_port: u16,
}

impl Browser {
    /// The URL of `path` on `host`, through the proxy.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.proxy_port)
    }

    /// Opens `url` in a fresh profile (no cookie but what the answers set) and returns what Chromium
    /// saw.
    pub async fn open(&self, url: &str) -> Page {
        let dir = fresh_dir("chromium");
        let netlog = dir.join("netlog.json");
        let mut command = Command::new(which("chromium"));
        command
            .arg("--headless")
            .arg("--no-sandbox")
            .arg("--disable-gpu")
            .arg("--no-first-run")
            .arg("--disable-dev-shm-usage")
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .arg(format!(
                "--host-resolver-rules=MAP *.{} 127.0.0.1, EXCLUDE localhost",
                self.domain
            ))
            .arg(format!("--log-net-log={}", netlog.display()))
            .arg("--net-log-capture-mode=Default")
            .arg("--dump-dom")
            .arg(url)
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        let out = tokio::time::timeout(
            PATIENCE,
            tokio::task::spawn_blocking(move || command.output()),
        )
        .await
        .expect("chromium finishes")
        .unwrap()
        .expect("chromium runs");
        let log = std::fs::read_to_string(&netlog).unwrap_or_default();
        let statuses = main_statuses(&log, url);
        let _ = std::fs::remove_dir_all(&dir);
        Page {
            statuses,
            dom: String::from_utf8_lossy(&out.stdout).into_owned(),
        }
    }
}

/// From Chromium's network log: the statuses of the request that started at `url` (its redirects
/// included, in order), not the favicon's or any other.
fn main_statuses(log: &str, url: &str) -> Vec<u16> {
    // Chromium may stop before closing the log's JSON: close it.
    let log: serde_json::Value = serde_json::from_str(log)
        .or_else(|_| serde_json::from_str(&format!("{}]}}", log.trim_end().trim_end_matches(','))))
        .unwrap_or_else(|e| panic!("chromium's network log reads: {e}"));
    let kind = |name: &str| log["constants"]["logEventTypes"][name].as_u64();
    let (Some(start), Some(headers)) = (
        kind("URL_REQUEST_START_JOB"),
        kind("HTTP_TRANSACTION_READ_RESPONSE_HEADERS"),
    ) else {
        panic!("chromium's network log names its event types");
    };
    let events = log["events"].as_array().map_or(&[][..], Vec::as_slice);
    let source = events.iter().find_map(|e| {
        (e["type"].as_u64() == Some(start) && e["params"]["url"].as_str() == Some(url))
            .then(|| e["source"]["id"].as_u64())
            .flatten()
    });
    events
        .iter()
        .filter(|e| e["type"].as_u64() == Some(headers) && e["source"]["id"].as_u64() == source)
        .filter_map(|e| {
            e["params"]["headers"][0]
                .as_str()?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()
        })
        .collect()
}
