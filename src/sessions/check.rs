//! The session check as `volcano-runner proxy-sync` runs it: one watch of the session records, the
//! [`Authz`] over them and the instance's route table, and its HTTP endpoint. Not ready (`/readyz`:
//! `failed sessions`) until the watch has listed every record, so an instance started after a session
//! was issued accepts it from its first answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::authz::{Authz, Sessions};
use super::origin::OriginPolicy;
use super::record::{SessionRecord, selector};
use super::server::AuthzServer;
use crate::config::ProxySyncConfig;
use crate::ops::Metrics;
use crate::ops::health::Condition;
use crate::routes::{HostNaming, Routes};

/// A running session check.
pub struct SessionCheck {
    /// The check itself, for callers in the same process (tests, the benchmark).
    pub authz: Arc<Authz>,
    /// Where the endpoint listens.
    pub addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// What the check needs.
pub struct CheckSettings {
    /// The runner's namespace, where the records are.
    pub namespace: String,
    pub naming: HostNaming,
    /// `[sessions] scheme` is `https`: cookies are `Secure` with the `__Host-` prefix, and a rank's own
    /// origin is `https://<host>`.
    pub secure: bool,
    /// `[sessions] allowed_origins`: the origins besides each rank's own that may use its sessions.
    pub allowed_origins: Vec<String>,
    pub clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Where every answer is counted (`authz_checks_total`); `None`: not counted.
    pub metrics: Option<Metrics>,
}

impl SessionCheck {
    /// Starts the watch and the endpoint on `config.authz_listen`; `ready` follows the watch.
    pub async fn start(
        client: kube::Client,
        routes: Routes,
        settings: CheckSettings,
        config: &ProxySyncConfig,
        ready: Option<Condition>,
        shutdown: CancellationToken,
    ) -> std::io::Result<SessionCheck> {
        let sessions = Sessions::default();
        let api = kube::Api::namespaced(client, &settings.namespace);
        let authz = Arc::new(
            Authz::new(
                sessions.clone(),
                settings.namespace.clone(),
                routes,
                settings.naming,
                settings.clock,
            )
            .with_origins(OriginPolicy::new(
                settings.secure,
                &settings.allowed_origins,
            )),
        );
        let server = AuthzServer::bind(
            &config.authz_listen,
            authz.clone(),
            settings.secure,
            config.authz_max_header_bytes,
        )
        .await?
        .counting(settings.metrics)
        .with_bridges(!config.bridge_url.is_empty());
        let addr = server.local_addr()?;
        info!(listen = %addr, namespace = %settings.namespace, "Serving the session check (/authz).");
        let token = shutdown.clone();
        let watch = tokio::spawn(async move {
            sessions
                .follow(
                    api,
                    watcher::Config::default().labels(&selector()),
                    "sessions",
                    SessionRecord::from_configmap,
                    token.cancelled(),
                )
                .await;
        });
        let (check, token) = (authz.clone(), shutdown.clone());
        let readiness = tokio::spawn(async move {
            let Some(ready) = ready else { return };
            loop {
                ready.set(if check.synced() {
                    Ok(())
                } else {
                    Err("the session records are not listed yet".into())
                });
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        });
        let serve = tokio::spawn(server.run(shutdown));
        Ok(SessionCheck {
            authz,
            addr,
            tasks: vec![watch, readiness, serve],
        })
    }

    /// Waits for its tasks to end (after the shutdown token given to [`SessionCheck::start`]).
    pub async fn join(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
