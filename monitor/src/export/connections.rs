//! Bounds on the HTTP server's connections: at most [`MAX_CONNECTIONS`] at once (more wait
//! in the kernel's accept queue), each closed after [`IDLE_TIMEOUT`] without a byte read or
//! written and after [`MAX_LIFETIME`] in any case. `axum::serve` gives hyper no timer, so
//! without these a client that opens connections and sends nothing (or a byte now and then)
//! would hold them, and the agent's memory, for ever.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::serve::Listener;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep, sleep_until},
};
use tracing::warn;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// A connection with nothing read or written for this long is closed (a scrape's keep-alive
/// connection waits 30 s between scrapes and reconnects; that costs one handshake).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Any connection is closed after this long.
pub const MAX_LIFETIME: Duration = Duration::from_secs(120);

/// A TCP listener that hands out [`Bounded`] connections.
pub struct BoundedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    idle: Duration,
    lifetime: Duration,
}

impl BoundedListener {
    pub fn new(inner: TcpListener) -> Self {
        Self::with_limits(inner, MAX_CONNECTIONS, IDLE_TIMEOUT, MAX_LIFETIME)
    }

    pub fn with_limits(inner: TcpListener, connections: usize, idle: Duration, lifetime: Duration) -> Self {
        Self { inner, permits: Arc::new(Semaphore::new(connections)), idle, lifetime }
    }
}

impl Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed.
        let permit = Arc::clone(&self.permits).acquire_owned().await.expect("the connection semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let now = Instant::now();
                    let connection = Bounded {
                        stream,
                        _permit: permit,
                        idle: self.idle,
                        idle_timer: Box::pin(sleep_until(now + self.idle)),
                        end_of_life: Box::pin(sleep_until(now + self.lifetime)),
                    };
                    return (connection, addr);
                }
                Err(error) => {
                    // EMFILE and the like: back off instead of spinning (as axum's own listener).
                    warn!(%error, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// One connection, holding its place among the [`MAX_CONNECTIONS`] until dropped.
pub struct Bounded {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    idle_timer: Pin<Box<Sleep>>,
    end_of_life: Pin<Box<Sleep>>,
}

impl Bounded {
    /// Polls `io` on the stream, unless the connection lived too long: Ready resets the idle
    /// timer; Pending checks it.
    fn poll_io<T>(
        &mut self,
        cx: &mut Context<'_>,
        io: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        // Checked at every poll: a chatty client never leaves its reads pending.
        if self.end_of_life.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "HTTP connection lived too long")));
        }
        match io(Pin::new(&mut self.stream), cx) {
            Poll::Ready(result) => {
                let deadline = Instant::now() + self.idle;
                self.idle_timer.as_mut().reset(deadline);
                Poll::Ready(result)
            }
            Poll::Pending if self.idle_timer.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "HTTP connection idle")))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Bounded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_io(cx, |stream, cx| stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_io(cx, |stream, cx| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn listener(connections: usize, idle_ms: u64, lifetime_ms: u64) -> (BoundedListener, SocketAddr) {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let listener = BoundedListener::with_limits(
            inner,
            connections,
            Duration::from_millis(idle_ms),
            Duration::from_millis(lifetime_ms),
        );
        (listener, addr)
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_a_busy_one_lives_until_its_end() {
        let (mut listener, addr) = listener(4, 300, 1_500).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut served, _) = listener.accept().await;
        let mut byte = [0u8; 1];
        // Traffic keeps it open past the idle timeout...
        for _ in 0..4 {
            client.write_all(b"x").await.unwrap();
            served.read_exact(&mut byte).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // ...silence does not.
        let error = served.read(&mut byte).await.unwrap_err();
        assert_eq!((error.kind(), error.to_string().as_str()), (io::ErrorKind::TimedOut, "HTTP connection idle"));
        // A chatty connection ends at its lifetime.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut served, _) = listener.accept().await;
        let started = Instant::now();
        let error = loop {
            client.write_all(b"x").await.unwrap();
            if let Err(error) = served.read_exact(&mut byte).await {
                break error;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(error.to_string(), "HTTP connection lived too long");
        assert!(started.elapsed() >= Duration::from_millis(1_400), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_one_to_close() {
        let (mut listener, addr) = listener(2, 60_000, 60_000).await;
        let _clients: Vec<TcpStream> =
            [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()].into();
        let _third = TcpStream::connect(addr).await.unwrap();
        let (first, _) = listener.accept().await;
        let (_second, _) = listener.accept().await;
        let third = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(third.is_err(), "a third connection was served while two were open");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), listener.accept()).await.expect("served once one closed");
    }
}
