//! Kubelets before Kubernetes 1.26 call device plugins with the socket's path as the HTTP/2 `:authority`
//! (`/var/lib/kubelet/device-plugins/….sock`), which is not a valid authority, and the HTTP/2 server under tonic
//! refuses every such request (`RST_STREAM PROTOCOL_ERROR`). [`AuthorityFix`] sits between the plugin's unix
//! socket and the server: it passes the kubelet's frames through, except that it re-encodes every header block
//! (HEADERS and its CONTINUATIONs, decoded with the kubelet's own compression state) as literal fields without
//! indexing, with an `:authority` that is not a valid authority replaced by `localhost`. What the server sends back
//! passes untouched. Malformed input closes the connection with an error; nothing is buffered without bound.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The frame size every HTTP/2 peer accepts (the server advertises no larger one).
const MAX_FRAME: usize = 16_384;
/// The largest header block accepted (a device plugin call's headers are a few hundred bytes).
const MAX_BLOCK: usize = 64 * 1024;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A unix stream whose incoming header blocks carry a valid `:authority`.
pub(crate) struct AuthorityFix {
    inner: UnixStream,
    raw: Vec<u8>,
    out: Vec<u8>,
    out_at: usize,
    preface_done: bool,
    /// The header block being gathered: its stream, END_STREAM, the fragments so far.
    block: Option<(u32, bool, Vec<u8>)>,
    decoder: loona_hpack::Decoder<'static>,
}

impl std::fmt::Debug for AuthorityFix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix").finish_non_exhaustive()
    }
}

impl AuthorityFix {
    /// Wrap an accepted connection.
    pub(crate) fn new(inner: UnixStream) -> Self {
        Self {
            inner,
            raw: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            preface_done: false,
            block: None,
            decoder: loona_hpack::Decoder::new(),
        }
    }

    /// Move what can be processed from `raw` to `out`.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_done {
            let n = self.raw.len().min(PREFACE.len());
            if self.raw[..n] != PREFACE[..n] {
                return Err(bad("not an HTTP/2 connection preface"));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            self.out.extend_from_slice(PREFACE);
            self.raw.drain(..PREFACE.len());
            self.preface_done = true;
        }
        loop {
            if self.raw.len() < 9 {
                return Ok(());
            }
            let len = usize::from(self.raw[0]) << 16
                | usize::from(self.raw[1]) << 8
                | usize::from(self.raw[2]);
            if self.raw.len() < 9 + len {
                if len > MAX_BLOCK {
                    return Err(bad("frame larger than accepted"));
                }
                return Ok(());
            }
            let kind = self.raw[3];
            let flags = self.raw[4];
            let stream = u32::from_be_bytes([self.raw[5], self.raw[6], self.raw[7], self.raw[8]])
                & 0x7fff_ffff;
            let frame: Vec<u8> = self.raw.drain(..9 + len).collect();
            let payload = &frame[9..];
            match (kind, &mut self.block) {
                (HEADERS, None) => {
                    let fragment = headers_fragment(flags, payload)?;
                    self.block = Some((stream, flags & END_STREAM != 0, fragment.to_vec()));
                    if flags & END_HEADERS != 0 {
                        self.finish_block()?;
                    }
                }
                (CONTINUATION, Some((s, _, buf))) if *s == stream => {
                    if buf.len() + payload.len() > MAX_BLOCK {
                        return Err(bad("header block larger than accepted"));
                    }
                    buf.extend_from_slice(payload);
                    if flags & END_HEADERS != 0 {
                        self.finish_block()?;
                    }
                }
                (_, Some(_)) => return Err(bad("a frame inside a header block")),
                (CONTINUATION, None) => return Err(bad("CONTINUATION without HEADERS")),
                _ => self.out.extend_from_slice(&frame),
            }
        }
    }

    fn finish_block(&mut self) -> io::Result<()> {
        let Some((stream, end_stream, block)) = self.block.take() else {
            return Ok(());
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.decoder
            .decode_with_cb(&block, |name, value| {
                fields.push((name.into_owned(), value.into_owned()));
            })
            .map_err(|e| bad(&format!("header block: {e:?}")))?;
        let mut encoded = Vec::with_capacity(block.len() + 16);
        for (name, value) in &fields {
            let value: &[u8] = if name == b":authority" && !valid_authority(value) {
                b"localhost"
            } else {
                value
            };
            // Literal header field without indexing, new name (RFC 7541 6.2.2).
            encoded.push(0);
            string(&mut encoded, name);
            string(&mut encoded, value);
        }
        let mut chunks = encoded.chunks(MAX_FRAME).peekable();
        let mut first = true;
        if encoded.is_empty() {
            frame(
                &mut self.out,
                HEADERS,
                END_HEADERS | if end_stream { END_STREAM } else { 0 },
                stream,
                &[],
            );
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut flags) = if first {
                (HEADERS, if end_stream { END_STREAM } else { 0 })
            } else {
                (CONTINUATION, 0)
            };
            if last {
                flags |= END_HEADERS;
            }
            frame(&mut self.out, kind, flags, stream, chunk);
            first = false;
        }
        Ok(())
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("device plugin connection: {what}"),
    )
}

/// The header block fragment of a HEADERS frame, without padding and priority.
fn headers_fragment(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or_else(|| bad("empty padded HEADERS"))?;
        pad = usize::from(n);
        p = rest;
    }
    if flags & PRIORITY != 0 {
        p = p.get(5..).ok_or_else(|| bad("short HEADERS priority"))?;
    }
    p.get(
        ..p.len()
            .checked_sub(pad)
            .ok_or_else(|| bad("HEADERS padding too long"))?,
    )
    .ok_or_else(|| bad("HEADERS padding too long"))
}

/// Whether the HTTP/2 server accepts `value` as an authority.
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// An HPACK integer with an `n`-bit prefix (the prefix's other bits zero).
fn integer(out: &mut Vec<u8>, mut v: usize, n: u32) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(v as u8);
        return;
    }
    out.push(max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK string literal without Huffman coding.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, s.len(), 7);
    out.extend_from_slice(s);
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

impl AsyncRead for AuthorityFix {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_at < this.out.len() {
                let n = (this.out.len() - this.out_at).min(buf.remaining());
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        // End of stream: whatever is left unprocessed is dropped with it.
                        return Poll::Ready(Ok(()));
                    }
                    this.raw.extend_from_slice(rb.filled());
                    this.process()?;
                }
            }
        }
    }
}

impl AsyncWrite for AuthorityFix {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AuthorityFix {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A gRPC call written frame by frame as a kubelet before 1.26 sends it: the socket's path as `:authority`,
    /// the header block split into HEADERS (padded, with priority) and a CONTINUATION.
    fn kubelet_call(path: &str) -> Vec<u8> {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (
                b":authority",
                b"/var/lib/kubelet/device-plugins/isthmus-nvidia.com_gpu.sock",
            ),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]);
        let (a, b) = block.split_at(10);
        let mut out = PREFACE.to_vec();
        frame(&mut out, 0x4, 0, 0, &[]); // SETTINGS
        let mut first = vec![2u8]; // pad length
        first.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0]);
        frame(&mut out, HEADERS, PADDED | PRIORITY, 1, &first);
        frame(&mut out, CONTINUATION, END_HEADERS, 1, b);
        frame(&mut out, 0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]); // DATA: an empty message
        out
    }

    #[test]
    fn a_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let input = kubelet_call("/v1beta1.DevicePlugin/GetDevicePluginOptions");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        a.set_nonblocking(true).unwrap();
        let mut fix = AuthorityFix::new(UnixStream::from_std(a).unwrap());
        // Fed in two pieces, cut inside a frame.
        fix.raw.extend_from_slice(&input[..40]);
        fix.process().unwrap();
        fix.raw.extend_from_slice(&input[40..]);
        fix.process().unwrap();
        let out = std::mem::take(&mut fix.out);
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let mut frames = Vec::new();
        let mut rest = &out[PREFACE.len()..];
        while rest.len() >= 9 {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            frames.push((rest[3], rest[4], rest[9..9 + len].to_vec()));
            rest = &rest[9 + len..];
        }
        let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(
            kinds,
            vec![(0x4, 0), (HEADERS, END_HEADERS), (0x0, END_STREAM)]
        );
        let mut dec = loona_hpack::Decoder::new();
        let fields = dec.decode(&frames[1].2).unwrap_or_else(|e| panic!("{e:?}"));
        let get = |n: &[u8]| fields.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(get(b":authority"), Some(b"localhost".to_vec()));
        assert_eq!(
            get(b":path"),
            Some(b"/v1beta1.DevicePlugin/GetDevicePluginOptions".to_vec())
        );
        assert_eq!(fields.len(), 6);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        a.set_nonblocking(true).unwrap();
        let stream = || UnixStream::from_std(a.try_clone().unwrap());
        for input in [
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            {
                let mut v = PREFACE.to_vec();
                frame(&mut v, CONTINUATION, END_HEADERS, 1, b"x");
                v
            },
            {
                let mut v = PREFACE.to_vec();
                frame(&mut v, HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff]);
                v
            },
            {
                let mut v = PREFACE.to_vec();
                frame(&mut v, HEADERS, PADDED | END_HEADERS, 1, &[9, 1]);
                v
            },
        ] {
            let mut fix = AuthorityFix::new(stream().unwrap());
            fix.raw = input;
            assert!(fix.process().is_err());
        }
    }

    /// What the real server answers to a kubelet's call with a path `:authority` (as kubelets before 1.26 send it):
    /// the call's `grpc-status`, or `Err` with what the server did instead (reset the stream, closed the
    /// connection).
    async fn answer_to_a_path_authority(rewrite: bool) -> Result<Vec<u8>, &'static str> {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("p.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(super::super::inventory::Devices::new());
        let plugin = super::super::service::Plugin {
            resource: "nvidia.com/gpu".into(),
            devices: rx,
            runtime_root: "/".into(),
            holds: tokio::sync::watch::channel(super::super::slurm_jobs::Holds::default()).1,
            slurm: None,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(super::super::serve(plugin, listener, stop.clone(), rewrite));
        let _stop = stop.drop_guard();
        let mut conn = UnixStream::connect(&sock).await.unwrap();
        conn.write_all(&kubelet_call(
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        ))
        .await
        .unwrap();
        // Read frames until the response's trailers (a HEADERS frame with END_STREAM on stream 1).
        let mut dec = loona_hpack::Decoder::new();
        let mut buf = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, conn.read(&mut chunk))
                .await
                .expect("an answer within 10 s")
                .unwrap();
            if n == 0 {
                return Err("the server closed the connection");
            }
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len =
                    usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
                if buf.len() < 9 + len {
                    break;
                }
                let f: Vec<u8> = buf.drain(..9 + len).collect();
                match f[3] {
                    0x3 => return Err("the server reset the stream"),
                    0x7 => return Err("the server sent GOAWAY"),
                    HEADERS => {
                        let fields = dec.decode(&f[9..]).unwrap();
                        if let Some((_, v)) = fields.iter().find(|(k, _)| k == b"grpc-status") {
                            return Ok(v.clone());
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// With `--device-plugin-rewrite-authority`, the real server answers the call it would otherwise refuse.
    #[tokio::test]
    async fn the_grpc_server_answers_a_call_with_a_path_authority_when_asked_to_rewrite_it() {
        assert_eq!(answer_to_a_path_authority(true).await, Ok(b"0".to_vec()));
    }

    /// Without it (the default, for kubelets from 1.26 on), the call goes to the server as sent, which refuses it:
    /// the option is what makes old kubelets work.
    #[tokio::test]
    async fn without_the_rewrite_the_server_refuses_a_path_authority() {
        assert!(answer_to_a_path_authority(false).await.is_err());
    }
}
