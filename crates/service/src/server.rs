//! The HTTP server under the API, built on hyper so that it can protect itself:
//!
//! - a connection limit: past it a connection is answered 503 (JSON) and closed, so that idle
//!   connections cannot take every file descriptor from health checks, ingest and rule reloads;
//! - a header timeout: a connection that sends no complete request head for that long, new or
//!   idle between requests, is closed (slow headers, idle keep-alive);
//! - a write timeout: a connection that does not take what it is sent for that long is closed
//!   (an alert stream client that never reads);
//! - JSON answers for what hyper refuses before any handler runs (a URI or headers too long,
//!   a malformed request), like every other error of the API.
//!
//! Request bodies are read by the handlers themselves, within the body timeout
//! ([`super::api::read_body`]).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// What the server holds connections to.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub write_timeout: Duration,
}

/// File descriptors kept for everything but HTTP connections: the store, Kafka, the logs.
const RESERVED_FDS: u64 = 256;

/// Raises the process's open-file limit to what it may be, and returns how many connections
/// fit under it next to [`RESERVED_FDS`]: at most `wanted`.
pub fn connections_that_fit(wanted: usize) -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    let fit = usize::try_from(limit.saturating_sub(RESERVED_FDS).max(16)).unwrap_or(usize::MAX);
    if fit < wanted {
        tracing::warn!(
            wanted,
            fit,
            open_files = limit,
            "fewer HTTP connections than --max-connections fit under the open-file limit"
        );
    }
    wanted.min(fit)
}

/// Serves `router` on `listener` (over TLS when `tls` is set) until `shutdown` completes, then
/// lets open requests finish (at most 5 s).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    tls: Option<Arc<super::tls::Tls>>,
    telemetry: Arc<super::telemetry::Telemetry>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or the peer gave up: wait a little, go on.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            telemetry.connections_refused.inc();
            // Over TLS a plain answer would not be read: the connection is closed.
            if tls.is_none() {
                tokio::spawn(refuse(stream));
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let open = telemetry.connections.clone();
        let service = TowerToHyperService::new(router.clone());
        match &tls {
            None => {
                let io = TokioIo::new(Guarded::new(stream, limits.write_timeout));
                let connection = graceful.watch(builder.serve_connection(io, service));
                tokio::spawn(async move {
                    open.inc();
                    let _ = connection.await;
                    open.dec();
                    drop(slot);
                });
            }
            Some(tls) => {
                // The handshake on the connection's own task, within the header timeout.
                let (acceptor, builder, watcher) = (tls.acceptor(), builder.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let shaken = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await;
                    let Ok(Ok(stream)) = shaken else { return };
                    let io = TokioIo::new(Guarded::new(stream, limits.write_timeout));
                    open.inc();
                    let _ = watcher.watch(builder.serve_connection(io, service)).await;
                    open.dec();
                    drop(slot);
                });
            }
        }
    }
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await.is_err() {
        tracing::warn!("open HTTP requests did not finish within 5 s of shutdown");
    }
}

/// Answers a connection over the limit, without reading it, and closes it.
async fn refuse(mut stream: TcpStream) {
    let body = r#"{"error":"too many connections; try again later"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
    let _ = stream.shutdown().await;
}

/// hyper's own answer to a request it could not read, turned into the API's JSON: the status
/// and a message, for a head that has no body. `None` for anything else.
fn json_answer(buf: &[u8]) -> Option<Vec<u8>> {
    // Cheap for every other write: the prefix first, and never more than a head's worth.
    if !buf.starts_with(b"HTTP/1.1 4") || buf.len() > 1024 {
        return None;
    }
    let text = std::str::from_utf8(buf).ok()?;
    let rest = text.strip_prefix("HTTP/1.1 ")?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    if !text.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let message = match status {
        400 => "the request is not HTTP/1.1 this server can read",
        414 => "the request's URI is too long",
        431 => "the request's headers are too large",
        _ => return None,
    };
    let reason = rest.lines().next().unwrap_or_default();
    let body = serde_json::json!({ "error": message }).to_string();
    Some(
        format!(
            "HTTP/1.1 {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// A connection with a write timeout, whose hyper-made error answers are rewritten as JSON.
struct Guarded<S> {
    stream: S,
    write_timeout: Duration,
    /// Running while a write waits for the peer to take data.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A rewritten answer being written: its bytes, how far, and the length hyper gave.
    rewrite: Option<(Vec<u8>, usize, usize)>,
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    fn new(stream: S, write_timeout: Duration) -> Self {
        Guarded { stream, write_timeout, stalled: None, rewrite: None }
    }

    /// Writes through to the socket; a write that waits longer than the timeout fails.
    fn write_through(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Pending => {
                let timeout = self.write_timeout;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client does not read")))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.rewrite.is_none() {
            if let Some(answer) = json_answer(buf) {
                this.rewrite = Some((answer, 0, buf.len()));
            }
        }
        let Some((answer, mut done, given)) = this.rewrite.take() else { return this.write_through(cx, buf) };
        while done < answer.len() {
            match this.write_through(cx, &answer[done..]) {
                Poll::Ready(Ok(n)) => done += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    this.rewrite = Some((answer, done, given));
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(given))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        // One buffer per write, so that an answer's head is seen whole.
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_error_answers_become_json_and_others_pass() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let answer = String::from_utf8(json_answer(head).expect("rewritten")).expect("utf-8");
        assert!(
            answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n")
        );
        assert!(answer.ends_with(r#"{"error":"the request's headers are too large"}"#), "{answer}");
        let ours = b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n";
        assert!(json_answer(ours).is_none(), "the API's own answers pass");
        assert!(json_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(json_answer(b"data: {}\n\n").is_none());
    }
}
