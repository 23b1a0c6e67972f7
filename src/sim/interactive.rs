//! Interactive pods: a pod whose container declares a port named `web` or `vnc` (the Proxy plugin
//! declares the application's port so) gets a pod IP in the loopback range, `127.a.b.c`, unique on this
//! machine (Linux routes all of 127/8 to `lo`), and while it runs the simulator serves on that IP and
//! port what the application would:
//!
//! - `web`: a small HTML page naming the VolcanoJob and the rank, for every path;
//! - `vnc`: the server side of an RFB 3.8 handshake (ProtocolVersion, security type None, ServerInit
//!   whose desktop name names the job and rank), then it reads and discards the client's messages.
//!
//! Every running pod also has a scratch directory, made on the first `pods/{name}/exec` into it
//! ([`super::exec`]): the working directory of the commands run there. When the pod ends (its
//! containers finished, it was deleted, or its node went) its listener and connections are closed, its
//! exec sessions are ended and its scratch directory is removed; shutting the simulator down does the
//! same for every pod. Each simulator owns its listeners: nothing outlives it.
//!
//! This is a development tool: it listens on loopback only, and exec runs a real `sh` as the user who
//! runs the simulator (docs/sim.md).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::sim::encode::ObjectKey;
use crate::sim::json::JsonPath;

/// What an interactive pod's application offers on its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppKind {
    Web,
    Vnc,
}

/// The application port a pod declares: its first container port named `web` or `vnc`.
pub fn app_port(pod: &Value) -> Option<(AppKind, u16)> {
    let containers = pod.at("/spec/containers")?.as_array()?;
    containers
        .iter()
        .filter_map(|c| c.get("ports")?.as_array())
        .flatten()
        .find_map(|p| {
            let kind = match p.get("name")?.as_str()? {
                "web" => AppKind::Web,
                "vnc" => AppKind::Vnc,
                _ => return None,
            };
            let port = u16::try_from(p.get("containerPort")?.as_u64()?).ok()?;
            (port != 0).then_some((kind, port))
        })
}

/// How many random loopback addresses are tried before a pod is given up on (another simulator, in
/// this or another process, may hold the same address and port).
const BIND_ATTEMPTS: usize = 64;

/// One running pod's share: its loopback address (interactive pods only), what ends its sessions, and
/// its scratch directory once made.
#[derive(Debug)]
struct PodShare {
    ip: Option<Ipv4Addr>,
    stop: CancellationToken,
    scratch: Option<PathBuf>,
}

/// What an exec into a running pod needs from the model.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    /// The pod's scratch directory (made if it was not yet).
    pub dir: PathBuf,
    /// Cancelled when the pod ends.
    pub stop: CancellationToken,
}

/// The interactive side of the simulated kubelet; see the module documentation.
#[derive(Debug)]
pub struct Interactive {
    /// Cancelled when the simulator stops: every pod's token is a child of it.
    root: CancellationToken,
    /// `<tmp>/volcano-runner-sim-<pid>-<random>`, made on the first exec.
    scratch_root: PathBuf,
    pods: HashMap<ObjectKey, PodShare>,
}

impl Default for Interactive {
    fn default() -> Self {
        Self {
            root: CancellationToken::new(),
            scratch_root: std::env::temp_dir().join(format!(
                "volcano-runner-sim-{}-{:016x}",
                std::process::id(),
                fastrand::u64(..)
            )),
            pods: HashMap::new(),
        }
    }
}

impl Drop for Interactive {
    fn drop(&mut self) {
        self.root.cancel();
        let _ = std::fs::remove_dir_all(&self.scratch_root);
    }
}

impl Interactive {
    /// Ties every pod's serving to `shutdown` (the simulator's).
    pub fn set_shutdown(&mut self, shutdown: CancellationToken) {
        self.root = shutdown;
    }

    /// The main containers of `pod` start: an interactive pod gets a loopback address and is served
    /// there until [`Interactive::stop`]. Returns the address, or `None` for a pod that is not
    /// interactive (or when no address could be bound: logged, and the pod keeps a node IP).
    pub fn start(&mut self, key: &ObjectKey, pod: &Value) -> Option<Ipv4Addr> {
        if let Some(share) = self.pods.get(key) {
            return share.ip;
        }
        let stop = self.root.child_token();
        let ip = app_port(pod).and_then(|(kind, port)| {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let listener = match bind_loopback(port) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(pod = %key.name, port, error = %e, "cannot serve an interactive pod on loopback; it gets a node IP and is not served");
                    return None;
                }
            };
            let ip = match listener.local_addr() {
                Ok(SocketAddr::V4(a)) => *a.ip(),
                _ => return None,
            };
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).ok()?;
            let title = title(pod);
            let stop = stop.clone();
            match kind {
                AppKind::Web => runtime.spawn(serve_web(listener, title, stop)),
                AppKind::Vnc => runtime.spawn(serve_vnc(listener, title, stop)),
            };
            Some(ip)
        });
        self.pods.insert(
            key.clone(),
            PodShare {
                ip,
                stop,
                scratch: None,
            },
        );
        ip
    }

    /// The loopback address of a running interactive pod.
    pub fn address(&self, key: &ObjectKey) -> Option<Ipv4Addr> {
        self.pods.get(key)?.ip
    }

    /// The pod ended or went: its listener, connections and exec sessions close, and its scratch
    /// directory is removed.
    pub fn stop(&mut self, key: &ObjectKey) {
        if let Some(share) = self.pods.remove(key) {
            share.stop.cancel();
            if let Some(dir) = share.scratch {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    /// Where an exec into the running pod `key` (uid `uid`) runs; `None` when the pod is not running
    /// here. Makes its scratch directory on first use.
    pub fn exec_target(
        &mut self,
        key: &ObjectKey,
        uid: &str,
    ) -> std::io::Result<Option<ExecTarget>> {
        let Some(share) = self.pods.get_mut(key) else {
            return Ok(None);
        };
        let dir = match &share.scratch {
            Some(d) => d.clone(),
            None => {
                let dir = self.scratch_root.join(sanitize(uid));
                std::fs::create_dir_all(&dir)?;
                share.scratch = Some(dir.clone());
                dir
            }
        };
        Ok(Some(ExecTarget {
            dir,
            stop: share.stop.clone(),
        }))
    }

    /// The scratch root, for tests.
    pub fn scratch_root(&self) -> &Path {
        &self.scratch_root
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `job <VolcanoJob name> rank <n>`, from the pod's Volcano labels.
fn title(pod: &Value) -> String {
    let label = |k: &str| {
        pod.at("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    format!(
        "job {} rank {}",
        label(crate::volcano::LABEL_JOB_NAME),
        label(crate::volcano::LABEL_TASK_INDEX)
    )
}

/// A listener on a random loopback address (`127.a.b.c`, not `127.0.0.0/16`, where the usual local
/// services are) and `port`.
fn bind_loopback(port: u16) -> std::io::Result<std::net::TcpListener> {
    let mut last = None;
    for _ in 0..BIND_ATTEMPTS {
        let ip = Ipv4Addr::new(
            127,
            fastrand::u8(1..=254),
            fastrand::u8(..),
            fastrand::u8(1..=254),
        );
        match std::net::TcpListener::bind((ip, port)) {
            Ok(l) => {
                l.set_nonblocking(true)?;
                return Ok(l);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                ) =>
            {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no loopback address was free")))
}

/// The web application: one page naming the job and rank, for every request.
async fn serve_web(listener: tokio::net::TcpListener, title: String, stop: CancellationToken) {
    let page = format!(
        "<!doctype html>\n<html><head><title>{title}</title></head>\
         <body><h1>{title}</h1><p>Served by the volcano-runner cluster simulator.</p></body></html>\n"
    );
    let app = axum::Router::new().fallback(move || {
        let page = page.clone();
        async move { axum::response::Html(page) }
    });
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
}

/// The VNC application: an RFB 3.8 handshake per connection.
async fn serve_vnc(listener: tokio::net::TcpListener, title: String, stop: CancellationToken) {
    let name = format!("volcano-runner sim: {title}");
    loop {
        let (conn, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(_) => continue,
            },
        };
        let (name, stop) = (name.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                _ = rfb_session(conn, &name) => {}
            }
        });
    }
}

/// The server side of RFB 3.8 (RFC 6143): version, security type None, ClientInit, ServerInit; then the
/// client's messages are read and discarded until it goes.
async fn rfb_session(mut conn: tokio::net::TcpStream, name: &str) -> std::io::Result<()> {
    conn.write_all(b"RFB 003.008\n").await?;
    let mut version = [0u8; 12];
    conn.read_exact(&mut version).await?;
    if !version.starts_with(b"RFB 003.") {
        return Ok(());
    }
    // One security type: None (1).
    conn.write_all(&[1, 1]).await?;
    let mut chosen = [0u8; 1];
    conn.read_exact(&mut chosen).await?;
    if chosen[0] != 1 {
        let reason = b"only security type None (1) is offered";
        let mut failed = vec![0, 0, 0, 1];
        failed.extend_from_slice(&(reason.len() as u32).to_be_bytes());
        failed.extend_from_slice(reason);
        conn.write_all(&failed).await?;
        return Ok(());
    }
    conn.write_all(&0u32.to_be_bytes()).await?;
    let mut client_init = [0u8; 1];
    conn.read_exact(&mut client_init).await?;
    let mut init = Vec::with_capacity(24 + name.len());
    init.extend_from_slice(&1024u16.to_be_bytes());
    init.extend_from_slice(&768u16.to_be_bytes());
    // Pixel format: 32 bpp, depth 24, little-endian, true colour, 8 bits per channel at 16, 8, 0.
    init.extend_from_slice(&[32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]);
    init.extend_from_slice(&(name.len() as u32).to_be_bytes());
    init.extend_from_slice(name.as_bytes());
    conn.write_all(&init).await?;
    let mut sink = [0u8; 4096];
    while conn.read(&mut sink).await? > 0 {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_app_port_is_the_container_port_named_web_or_vnc() {
        let pod =
            |ports: Value| json!({"spec": {"containers": [{"name": "user-job", "ports": ports}]}});
        assert_eq!(
            app_port(&pod(json!([{"name": "web", "containerPort": 8888}]))),
            Some((AppKind::Web, 8888))
        );
        assert_eq!(
            app_port(&pod(
                json!([{"name": "metrics", "containerPort": 9000}, {"name": "vnc", "containerPort": 5901}])
            )),
            Some((AppKind::Vnc, 5901))
        );
        assert_eq!(
            app_port(&pod(json!([{"name": "metrics", "containerPort": 9000}]))),
            None
        );
        assert_eq!(
            app_port(&json!({"spec": {"containers": [{"name": "x"}]}})),
            None
        );
    }
}
