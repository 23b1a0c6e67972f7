//! The socket under lapin: TCP (and TLS for `amqps://`) as lapin would open it, with the inbound plaintext
//! passed through a [`Sanitizer`] so that bytes a publisher put in a short string cannot make lapin drop
//! the connection (see [`super::sanitize`]).
//!
//! lapin reads from whatever its runtime's reactor calls a TCP stream, wrapped in its own plain-or-TLS
//! enum, and does TLS itself when it connects. The rewriter must see the plaintext, so here the roles are
//! swapped: [`connect`] opens the connection and does the TLS handshake exactly as lapin does
//! (amq-protocol-tcp, rustls with the native roots), wraps the result in a [`Sanitizing`] stream, and hands
//! that to lapin as a *plain* stream through [`lapin::Connection::connector`]. The runtime lapin gets is
//! tokio's, with a reactor ([`SanitizingReactor`]) whose only difference is that stream type.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures::io::{AsyncRead, AsyncWrite};
use futures::{FutureExt, Stream};
use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream, OwnedTLSConfig};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};

use super::sanitize::Sanitizer;

/// The stream under TLS: tokio's TCP stream as async-rs adapts it.
type Tcp = <Tokio as Reactor>::TcpStream;

/// What lapin reads from and writes to: the TCP or TLS stream, its inbound bytes sanitized.
pub type Inner = AsyncTcpStream<Tcp>;

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// A stream whose inbound bytes pass through a [`Sanitizer`]; outbound bytes pass unchanged.
pub struct Sanitizing<S> {
    inner: S,
    sanitizer: Sanitizer,
    /// Sanitized bytes not yet read by lapin, from `ready_at`.
    ready: Vec<u8>,
    ready_at: usize,
    chunk: Box<[u8]>,
    eof: bool,
}

impl<S> std::fmt::Debug for Sanitizing<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sanitizing")
            .field("rewritten", &self.sanitizer.rewritten())
            .finish_non_exhaustive()
    }
}

impl<S> Sanitizing<S> {
    /// `client_frame_max` is what the client offers (`frame_max` of the URL; 0 for no limit).
    pub fn new(inner: S, client_frame_max: u32) -> Self {
        Self {
            inner,
            sanitizer: Sanitizer::new(client_frame_max),
            ready: Vec::new(),
            ready_at: 0,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            eof: false,
        }
    }

    fn hand_out(&mut self, buf: &mut [u8]) -> usize {
        let n = (self.ready.len() - self.ready_at).min(buf.len());
        buf[..n].copy_from_slice(&self.ready[self.ready_at..self.ready_at + n]);
        self.ready_at += n;
        if self.ready_at == self.ready.len() {
            self.ready.clear();
            self.ready_at = 0;
        }
        n
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sanitizing<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // Read until there is something to hand out: a partial frame produces nothing yet.
        while this.ready_at == this.ready.len() {
            if this.eof {
                return Poll::Ready(Ok(0));
            }
            match Pin::new(&mut this.inner).poll_read(cx, &mut this.chunk) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    this.eof = true;
                    this.sanitizer.finish(&mut this.ready);
                }
                Poll::Ready(Ok(n)) => this.sanitizer.push(&this.chunk[..n], &mut this.ready),
            }
        }
        Poll::Ready(Ok(this.hand_out(buf)))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sanitizing<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

/// tokio's reactor, except that a TCP stream is a [`Sanitizing`] one. Timers and everything else are
/// tokio's.
#[derive(Debug, Clone)]
pub struct SanitizingReactor(Tokio);

impl Reactor for SanitizingReactor {
    type TcpStream = Sanitizing<Inner>;
    type Sleep = <Tokio as Reactor>::Sleep;

    // async-rs's `AsSysFd` is sealed; it is exactly `AsFd + AsRawFd`.
    fn register<H: io::Read + io::Write + AsFd + AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        self.0.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        // lapin connects through `connect`'s closure; this is what a plain connection would be.
        self.0
            .tcp_connect_addr(addr)
            .map(|r| r.map(|tcp| Sanitizing::new(AsyncTcpStream::Plain(tcp), 0)))
    }
}

/// The runtime lapin is given.
pub type Kit = RuntimeParts<Tokio, SanitizingReactor>;

/// Connects to `uri` as [`lapin::Connection::connect_uri`] would (TCP, TLS for `amqps`, the default TLS
/// configuration), with the inbound frames sanitized. Must be called within a tokio runtime.
pub async fn connect(uri: AMQPUri, properties: ConnectionProperties) -> lapin::Result<Connection> {
    let tokio = Tokio::current();
    let runtime = Runtime::new(RuntimeParts::new(
        tokio.clone(),
        SanitizingReactor(tokio.clone()),
    ));
    let plain = Runtime::new(tokio);
    let client_frame_max = uri.query.frame_max.unwrap_or(0);
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, _runtime: Runtime<Kit>| {
            let tls = OwnedTLSConfig::default();
            let stream = uri
                .connect_with_config_async(tls.as_ref(), &plain)
                .await
                .map_err(lapin::Error::from)?;
            Ok(AsyncTcpStream::Plain(Sanitizing::new(
                stream,
                client_frame_max,
            )))
        },
        properties,
    )
    .await
}
