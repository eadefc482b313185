//! Reading one review body within bounds: it must declare its length (the API server always does), arrive whole
//! within [`Limits::body_timeout`](super::gate::Limits) of its headers, and have its bytes reserved in the gate
//! before they are read. A body longer than [`Limits::max_body`](super::gate::Limits) is not kept: its first
//! [`PREFIX`] bytes are (the review's head is there, [`super::head::from_prefix`]) and the rest is read and dropped,
//! so that the caller still gets an answer for it.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::StatusCode;
use tokio::time::Instant;

use super::gate::{Busy, Conn, Reservation};

/// What is kept of a body too long to read whole.
pub(crate) const PREFIX: usize = 64 << 10;

/// A body, read.
#[derive(Debug)]
pub(crate) enum Body {
    /// All of it, with the bytes reserved for it.
    Whole(Vec<u8>, Reservation),
    /// Longer than the limit: its first [`PREFIX`] bytes and its length.
    Long {
        /// The first bytes.
        prefix: Vec<u8>,
        /// Its whole length.
        length: u64,
        /// The bytes reserved for the prefix: held, not read, so that they return to the gate when the body is
        /// dropped.
        _reservation: Reservation,
    },
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// No `Content-Length`.
    #[error("the request declares no Content-Length")]
    NoLength,
    /// Not whole in time.
    #[error("the request body did not arrive whole within {0:?} of its headers")]
    Timeout(std::time::Duration),
    /// Its bytes could not be reserved.
    #[error(transparent)]
    Busy(#[from] Busy),
    /// The connection failed, or the body was not its declared length.
    #[error("reading the request body: {0}")]
    Read(String),
}

impl BodyError {
    /// The HTTP status that says it.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            BodyError::NoLength => StatusCode::LENGTH_REQUIRED,
            BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Read `body` (declared `length` bytes long) for connection `conn`, by `deadline`, keeping at most `max` bytes.
pub(crate) async fn read<B>(
    mut body: B,
    length: Option<u64>,
    max: usize,
    conn: &Conn,
    deadline: Instant,
    timeout: std::time::Duration,
) -> Result<Body, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let length = length.ok_or(BodyError::NoLength)?;
    let whole = usize::try_from(length).ok().filter(|l| *l <= max);
    let keep = whole.unwrap_or(PREFIX.min(max));
    let reservation = conn.reserve(keep).await?;
    let mut kept = Vec::with_capacity(keep);
    let mut seen = 0u64;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout(timeout)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > length {
            return Err(BodyError::Read(format!(
                "more than the {length} bytes declared"
            )));
        }
        let room = keep - kept.len();
        kept.extend_from_slice(&data[..data.len().min(room)]);
    }
    if seen != length {
        return Err(BodyError::Read(format!(
            "{seen} bytes of the {length} declared"
        )));
    }
    Ok(match whole {
        Some(_) => Body::Whole(kept, reservation),
        None => Body::Long {
            prefix: kept,
            length,
            _reservation: reservation,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::gate::{Gate, Limits};
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;
    use std::time::Duration;

    fn gate() -> std::sync::Arc<Gate> {
        Gate::new(Limits {
            bytes: 1 << 20,
            reserve_wait: Duration::from_millis(50),
            ..Limits::default()
        })
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn a_whole_body_is_kept_with_its_bytes_reserved() {
        let gate = gate();
        let conn = gate.admit().unwrap_or_else(|| panic!("conn"));
        let body = Full::new(Bytes::from_static(b"{\"a\":1}"));
        let got = read(body, Some(7), 100, &conn, soon(), Duration::from_secs(5)).await;
        let Ok(Body::Whole(bytes, _r)) = got else {
            panic!("{got:?}")
        };
        assert_eq!(bytes, b"{\"a\":1}");
        assert_eq!(gate.bytes_in_use(), 7);
    }

    #[tokio::test]
    async fn a_long_body_keeps_its_prefix_only() {
        let gate = gate();
        let conn = gate.admit().unwrap_or_else(|| panic!("conn"));
        let data = vec![b'x'; 3 * PREFIX];
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = data
            .chunks(1000)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = StreamBody::new(futures::stream::iter(chunks));
        let len = data.len() as u64;
        let got = read(
            body,
            Some(len),
            PREFIX + 1,
            &conn,
            soon(),
            Duration::from_secs(5),
        )
        .await;
        let Ok(Body::Long { prefix, length, .. }) = got else {
            panic!("{got:?}")
        };
        assert_eq!((prefix.len(), length), (PREFIX, len));
        assert_eq!(gate.bytes_in_use(), PREFIX);
    }

    #[tokio::test]
    async fn no_length_a_wrong_length_and_a_late_body_are_errors() {
        let gate = gate();
        let conn = gate.admit().unwrap_or_else(|| panic!("conn"));
        let t = Duration::from_secs(5);
        let full = || Full::new(Bytes::from_static(b"abc"));
        let e = read(full(), None, 100, &conn, soon(), t)
            .await
            .expect_err("no length");
        assert_eq!(e.status(), StatusCode::LENGTH_REQUIRED);
        let e = read(full(), Some(2), 100, &conn, soon(), t)
            .await
            .expect_err("longer");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let e = read(full(), Some(4), 100, &conn, soon(), t)
            .await
            .expect_err("shorter");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let never = StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, std::convert::Infallible>,
        >());
        let late = Instant::now() + Duration::from_millis(30);
        let e = read(never, Some(4), 100, &conn, late, t)
            .await
            .expect_err("late");
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(gate.bytes_in_use(), 0, "every reservation returned");
    }
}
