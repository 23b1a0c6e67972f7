//! The server side of a WebSocket handshake (RFC 6455) on an axum request: the simulator's
//! `pods/{name}/exec` ([`crate::sim::exec`]) and the session bridges of proxy-sync
//! ([`crate::proxy::bridge`]) use it. The frames are tokio-tungstenite's, the same crate kube's `ws`
//! feature speaks exec with.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// A server-side WebSocket connection.
pub type ServerSocket = WebSocketStream<TokioIo<Upgraded>>;

/// Why a request cannot be upgraded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    #[error(
        "Upgrade request required: this path is served over WebSocket (send Connection: Upgrade, \
         Upgrade: websocket and a Sec-WebSocket-Key)"
    )]
    NotWebSocket,
    #[error("none of the WebSocket subprotocols offered is served here; offer one of: {0}")]
    NoProtocol(String),
}

/// An accepted upgrade: answer with [`Accepted::response`], then [`Accepted::socket`] gives the socket.
#[derive(Debug)]
pub struct Accepted {
    on_upgrade: OnUpgrade,
    accept: String,
    /// The subprotocol chosen, if any was asked for.
    pub protocol: Option<&'static str>,
}

/// The subprotocols the client offers (one header with a comma-separated list, or several headers).
fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The first of `served` the client offers.
pub fn choose_protocol(headers: &HeaderMap, served: &[&'static str]) -> Option<&'static str> {
    let offered = offered(headers);
    served
        .iter()
        .copied()
        .find(|p| offered.iter().any(|o| o == p))
}

/// Accepts `request` as a WebSocket upgrade. With `required` subprotocols, the client must offer one
/// of them (the first offered in that order is chosen); `optional` ones are chosen when offered, and
/// a client that offers none of them is served without one.
pub fn accept(
    request: &mut Request,
    required: &[&'static str],
    optional: &[&'static str],
) -> Result<Accepted, UpgradeError> {
    let headers = request.headers();
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).filter(|_| upgrade) else {
        return Err(UpgradeError::NotWebSocket);
    };
    let accept = derive_accept_key(key.as_bytes());
    let protocol = if required.is_empty() {
        choose_protocol(headers, optional)
    } else {
        Some(
            choose_protocol(headers, required)
                .ok_or_else(|| UpgradeError::NoProtocol(required.join(", ")))?,
        )
    };
    let on_upgrade = hyper::upgrade::on(request);
    Ok(Accepted {
        on_upgrade,
        accept,
        protocol,
    })
}

impl Accepted {
    /// The `101 Switching Protocols` answer.
    pub fn response(&self) -> Response {
        let mut r = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_ACCEPT, self.accept.as_str());
        if let Some(p) = self.protocol {
            r = r.header(header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        r.body(Body::empty())
            .unwrap_or_else(|_| Response::new(Body::empty()))
    }

    /// The socket, once the answer has been sent; `None` when the client went first.
    pub async fn socket(self) -> Option<ServerSocket> {
        let upgraded = self.on_upgrade.await.ok()?;
        Some(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_served_subprotocol_offered_is_chosen() {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "v4.channel.k8s.io, v5.channel.k8s.io".parse().unwrap(),
        );
        let served = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
        assert_eq!(choose_protocol(&h, &served), Some("v5.channel.k8s.io"));
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "v4.channel.k8s.io".parse().unwrap(),
        );
        assert_eq!(choose_protocol(&h, &served), Some("v4.channel.k8s.io"));
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            "channel.k8s.io".parse().unwrap(),
        );
        assert_eq!(choose_protocol(&h, &served), None);
    }

    #[test]
    fn a_plain_request_is_not_upgraded() {
        let mut r = Request::new(Body::empty());
        assert_eq!(
            accept(&mut r, &[], &[]).unwrap_err(),
            UpgradeError::NotWebSocket
        );
        let mut r = Request::builder()
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .body(Body::empty())
            .unwrap();
        let e = accept(&mut r, &["v5.channel.k8s.io"], &[]).unwrap_err();
        assert!(e.to_string().contains("v5.channel.k8s.io"), "{e}");
    }
}
