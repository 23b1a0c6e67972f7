//! [`OpsServer`]: the HTTP endpoint Prometheus scrapes and the kubelet probes.
//!
//! - `GET /metrics`: [`Metrics::encode`], OpenMetrics text.
//! - `GET /healthz`: `200 ok` while the process serves requests at all (liveness).
//! - `GET /readyz`: `200` when every readiness check passes, else `503`; the body lists each check, so
//!   `curl :9090/readyz` says what is wrong.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use super::{Metrics, Readiness, metrics};

/// The bound endpoint; [`run`](OpsServer::run) serves it until shutdown.
#[derive(Debug)]
pub struct OpsServer {
    listener: TcpListener,
    state: AppState,
}

#[derive(Debug, Clone)]
struct AppState {
    metrics: Metrics,
    readiness: Readiness,
}

impl OpsServer {
    /// Binds the address now, so a port already in use fails the start instead of a probe later.
    pub async fn bind(
        addr: SocketAddr,
        metrics: Metrics,
        readiness: Readiness,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen on {addr} ([ops] listen): {e}"),
            )
        })?;
        Ok(Self {
            listener,
            state: AppState { metrics, readiness },
        })
    }

    /// The address it listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then finishes the requests in progress.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

async fn scrape(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let report = state.readiness.evaluate().await;
    let status = if report.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        report.text(),
    )
}
