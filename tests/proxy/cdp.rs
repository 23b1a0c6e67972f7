//! Headless Chromium driven over the DevTools protocol: one browser profile kept across pages (its
//! cookies are a user's), pages opened through Caddy, and scripts run in a page as that page's own
//! (what a script of the page could do, from the page's origin). For the tests of where a request comes
//! from: a victim's browser visiting another job's page.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::monitor_support::PATIENCE;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A Chromium process of the test's, with one page. Killed when dropped.
pub struct Chrome {
    child: Child,
    dir: PathBuf,
    socket: Socket,
    session: String,
    next_id: u64,
    /// The port of the proxy the page addresses go to.
    pub proxy_port: u16,
}

impl Drop for Chrome {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Chrome {
    /// Starts Chromium with a fresh profile, every host under `domain` resolved to the proxy on
    /// loopback, and attaches to a blank page.
    pub async fn start(domain: &str, proxy_port: u16) -> Chrome {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vr-cdp-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let profile = dir.join("profile");
        let child = Command::new("chromium")
            .arg("--headless")
            .arg("--no-sandbox")
            .arg("--disable-gpu")
            .arg("--no-first-run")
            .arg("--disable-dev-shm-usage")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!(
                "--host-resolver-rules=MAP *.{domain} 127.0.0.1, EXCLUDE localhost"
            ))
            .arg("--remote-debugging-port=0")
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium is installed (scripts/test installs it)");
        // Chromium writes the port and the browser's path once it listens.
        let active = profile.join("DevToolsActivePort");
        let wait = async {
            loop {
                if let Ok(text) = std::fs::read_to_string(&active)
                    && let [port, path, ..] = text.lines().collect::<Vec<_>>()[..]
                {
                    return format!("ws://127.0.0.1:{port}{path}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let url = tokio::time::timeout(PATIENCE, wait)
            .await
            .expect("chromium's DevTools listen");
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("chromium's DevTools accept");
        let mut chrome = Chrome {
            child,
            dir,
            socket,
            session: String::new(),
            next_id: 0,
            proxy_port,
        };
        let target = chrome
            .call("Target.createTarget", json!({"url": "about:blank"}), false)
            .await;
        let target = target["targetId"].as_str().expect("a target").to_owned();
        let attached = chrome
            .call(
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
                false,
            )
            .await;
        chrome.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_owned();
        chrome.call("Page.enable", json!({}), true).await;
        chrome
    }

    /// The URL of `path` on `host`, through the proxy.
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.proxy_port)
    }

    /// The origin of `host`'s pages, as the browser names it.
    pub fn origin(&self, host: &str) -> String {
        format!("http://{host}:{}", self.proxy_port)
    }

    /// One command (to the page when `page`, else to the browser) and its result.
    async fn call(&mut self, method: &str, params: Value, page: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if page {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .expect("DevTools takes the command");
        loop {
            let reply = self.next_message(method).await;
            if reply["id"].as_u64() == Some(id) {
                if let Some(error) = reply.get("error") {
                    panic!("DevTools refused {method}: {error}");
                }
                return reply["result"].clone();
            }
        }
    }

    async fn next_message(&mut self, waiting_for: &str) -> Value {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools did not answer {waiting_for} within patience"))
                .expect("DevTools stays connected")
                .expect("DevTools speaks WebSocket");
            if let Message::Text(text) = message {
                return serde_json::from_str(text.as_str()).expect("DevTools speaks JSON");
            }
        }
    }

    /// Opens `url` in the page, as a user typing it would, and waits until it has loaded.
    pub async fn goto(&mut self, url: &str) {
        let navigated = self.call("Page.navigate", json!({"url": url}), true).await;
        assert!(
            navigated.get("errorText").is_none(),
            "{url} did not open: {navigated}"
        );
        loop {
            let event = self.next_message("Page.loadEventFired").await;
            if event["method"] == "Page.loadEventFired" {
                return;
            }
        }
    }

    /// Runs `script` (an expression, awaited if it is a promise) in the page, as the page's own script,
    /// and returns its value.
    pub async fn eval(&mut self, script: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": script, "awaitPromise": true, "returnByValue": true}),
                true,
            )
            .await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("the script threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// The status of a same-origin `fetch` of `path` from the page (with its cookies).
    pub async fn fetch_status(&mut self, path: &str) -> u64 {
        self.eval(&format!(
            "fetch({path:?}, {{credentials: 'include', cache: 'no-store'}}).then(r => r.status)"
        ))
        .await
        .as_u64()
        .expect("a status")
    }
}

/// A script that opens a WebSocket to `url` from the page it runs in and says what came of it:
/// `refused` (closed or failed before it opened), or, once open, what the bridge sent first:
/// `terminal:<output>` after sending `input` (for a terminal, until the output contains `expect`),
/// `bytes:<text>` for the first binary message otherwise, `text:<message>` for a text message.
pub fn websocket_probe(url: &str, input: &str, expect: &str) -> String {
    format!(
        r#"new Promise(resolve => {{
            let opened = false, out = '';
            const ws = new WebSocket({url:?}, ['binary']);
            ws.binaryType = 'arraybuffer';
            const done = v => {{ try {{ ws.close(); }} catch (e) {{}} resolve(v); }};
            ws.onopen = () => {{ opened = true; if ({input:?}) ws.send(new TextEncoder().encode({input:?})); }};
            ws.onerror = () => {{ if (!opened) done('refused'); }};
            ws.onclose = e => done(opened ? 'closed:' + e.code + ':' + e.reason + ':' + out : 'refused');
            ws.onmessage = m => {{
                if (typeof m.data === 'string') return done('text:' + m.data);
                const text = new TextDecoder().decode(new Uint8Array(m.data));
                if (!{expect:?}) return done('bytes:' + text);
                out += text;
                if (out.includes({expect:?})) done('terminal:' + out);
            }};
            setTimeout(() => done('timeout:' + opened + ':' + out), 20000);
        }})"#
    )
}
