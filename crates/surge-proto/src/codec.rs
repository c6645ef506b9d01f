//! Reading and writing whole frames, blocking (the server's per-connection threads) and async
//! (the client's tokio connections).

use crate::frame::{FrameError, Header, HEADER_LEN, READ_STEP, RESPONSE_BIT};
use crate::msg::{ErrorCode, ErrorReply, Request, Response};
use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, IoSlice, Read, Write};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, Error)]
pub enum CodecError {
    #[error("connection closed")]
    Closed,
    #[error("connection closed in the middle of a frame ({0})")]
    Truncated(&'static str),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("undecodable message: {0}")]
    Decode(#[from] postcard::Error),
    /// No frame began within the stream's idle timeout (see [`Waits`]).
    #[error("idle: {0}")]
    Idle(io::Error),
    /// A frame began but did not arrive whole within the stream's frame timeout.
    #[error("frame cut off in its {0}: {1}")]
    Stalled(&'static str, io::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Where a frame reader is, told to the stream under it so that the stream can bound its
/// waits: the server's sockets wait up to an idle timeout for a frame to begin and up to a
/// frame timeout for a begun frame to end ([`crate::transport::Polled`]). A wait that runs out
/// fails with [`io::ErrorKind::TimedOut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Between frames: waiting for the first byte of the next one.
    Idle,
    /// Inside a frame whose first byte has arrived.
    Frame,
}

/// A byte stream that is told the reader's [`Phase`].
pub trait Waits {
    fn waiting(&mut self, phase: Phase);
}

/// In-memory frames never wait.
impl Waits for &[u8] {
    fn waiting(&mut self, _: Phase) {}
}

impl<R: Waits> Waits for std::io::BufReader<R> {
    fn waiting(&mut self, phase: Phase) {
        self.get_mut().waiting(phase)
    }
}

impl CodecError {
    /// The error code a peer should be sent for this failure, if the connection can still carry
    /// a reply.
    pub fn reply_code(&self) -> ErrorCode {
        match self {
            CodecError::Frame(FrameError::Version { .. }) => ErrorCode::Version,
            CodecError::Frame(FrameError::PayloadTooLarge(_)) => ErrorCode::TooLarge,
            CodecError::Frame(FrameError::MetaTooLarge(_)) => ErrorCode::TooLarge,
            CodecError::Frame(FrameError::Anonymous(_)) => ErrorCode::Denied,
            CodecError::Idle(_) => ErrorCode::IdleClosed,
            CodecError::Stalled(..) => ErrorCode::TimedOut,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Encodes a message. Our message types have no maps with non-string keys and no custom
/// serializers, so this fails only if one is added: the send fails with the reason then.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encoding: {e}")))
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// Header + encoded message in one buffer, so a frame without payload is one write.
pub fn frame_prefix(opcode: u16, request_id: u64, meta: &[u8], payload_len: usize) -> Vec<u8> {
    frame_prefix_as(opcode, request_id, 0, meta, payload_len)
}

/// [`frame_prefix`] of a request acting for client session `session`.
pub fn frame_prefix_as(
    opcode: u16,
    request_id: u64,
    session: u32,
    meta: &[u8],
    payload_len: usize,
) -> Vec<u8> {
    let mut h = Header::request(opcode, request_id, meta.len() as u32, payload_len as u32);
    h.session = session;
    let mut buf = Vec::with_capacity(HEADER_LEN + meta.len());
    buf.extend_from_slice(&h.encode());
    buf.extend_from_slice(meta);
    buf
}

/// Writes a response frame (blocking).
pub fn write_response<W: Write>(
    w: &mut W,
    opcode: u16,
    request_id: u64,
    resp: &Response,
    payload: &[u8],
) -> io::Result<()> {
    let meta = encode(resp)?;
    let prefix = frame_prefix(opcode | RESPONSE_BIT, request_id, &meta, payload.len());
    write_all_vectored(w, &prefix, payload)
}

/// Writes the header and message of a response whose `payload_len` bytes of payload the
/// caller sends next itself (`sendfile` from a file).
pub fn write_response_head<W: Write>(
    w: &mut W,
    opcode: u16,
    request_id: u64,
    resp: &Response,
    payload_len: usize,
) -> io::Result<()> {
    let meta = encode(resp)?;
    let prefix = frame_prefix(opcode | RESPONSE_BIT, request_id, &meta, payload_len);
    w.write_all(&prefix)
}

fn write_all_vectored<W: Write>(w: &mut W, a: &[u8], b: &[u8]) -> io::Result<()> {
    let (mut a, mut b) = (a, b);
    while !a.is_empty() || !b.is_empty() {
        let n = if a.is_empty() {
            w.write(b)?
        } else {
            w.write_vectored(&[IoSlice::new(a), IoSlice::new(b)])?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    w.flush()
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the first byte.
fn read_exact_or_eof<R: Read>(
    r: &mut R,
    buf: &mut [u8],
    what: &'static str,
) -> Result<bool, CodecError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(CodecError::Truncated(what)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Reads a frame's header: the wait for its first byte is an idle wait, the rest of the frame
/// is inside it (see [`Phase`]). `Ok(false)` on a clean EOF before the first byte.
fn read_header<R: Read + Waits>(r: &mut R, hb: &mut [u8; HEADER_LEN]) -> Result<bool, CodecError> {
    r.waiting(Phase::Idle);
    let first = loop {
        match r.read(&mut hb[..]) {
            Ok(0) => return Ok(false),
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(CodecError::Idle(e)),
            Err(e) => return Err(e.into()),
        }
    };
    r.waiting(Phase::Frame);
    if !read_exact_or_eof(r, &mut hb[first..], "header").map_err(|e| stalled(e, "header"))?
        && first < HEADER_LEN
    {
        return Err(CodecError::Truncated("header"));
    }
    Ok(true)
}

/// A timed-out read inside a frame is a stalled frame.
fn stalled(e: CodecError, what: &'static str) -> CodecError {
    match e {
        CodecError::Io(e) if e.kind() == io::ErrorKind::TimedOut => CodecError::Stalled(what, e),
        e => e,
    }
}

/// Reads `len` bytes into `buf` (which ends up `len` long). Its memory grows by at most
/// [`READ_STEP`] beyond the bytes that arrived: a peer that announces a large frame and
/// stalls holds little; a buffer already large enough (reused across frames) is filled in
/// place.
pub fn read_stepwise<R: Read>(
    r: &mut R,
    buf: &mut Vec<u8>,
    len: usize,
    what: &'static str,
) -> Result<(), CodecError> {
    buf.truncate(len);
    let mut got = 0;
    while got < len {
        if got == buf.len() {
            buf.resize(got + (len - got).min(READ_STEP), 0);
        }
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(CodecError::Truncated(what)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(stalled(e.into(), what)),
        }
    }
    Ok(())
}

/// A received request frame (blocking side).
pub struct RequestFrame {
    pub header: Header,
    pub request: Request,
}

/// Reads one request frame; its payload goes into `payload` (reused across calls so large
/// writes do not allocate; memory is taken as the bytes arrive, not when a length is
/// announced). `Ok(None)` on a clean close. A frame that fails after its header is returned as
/// `Err((Some(request_id), error))` so the caller can reply before closing.
pub fn read_request<R: Read + Waits>(
    r: &mut R,
    payload: &mut Vec<u8>,
) -> Result<Option<RequestFrame>, (Option<u64>, CodecError)> {
    read_request_within(r, payload, None)
}

/// [`read_request`], refusing (before reading it) a frame whose message and payload together
/// exceed `limit` bytes (see [`crate::frame::MAX_ANONYMOUS`]).
pub fn read_request_within<R: Read + Waits>(
    r: &mut R,
    payload: &mut Vec<u8>,
    limit: Option<u64>,
) -> Result<Option<RequestFrame>, (Option<u64>, CodecError)> {
    let mut hb = [0u8; HEADER_LEN];
    match read_header(r, &mut hb) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => return Err((None, e)),
    }
    let header = Header::decode(&hb).map_err(|(id, e)| (Some(id), CodecError::Frame(e)))?;
    let id = Some(header.request_id);
    let size = header.meta_len as u64 + header.payload_len as u64;
    if limit.is_some_and(|l| size > l) {
        return Err((id, CodecError::Frame(FrameError::Anonymous(size))));
    }
    let mut meta = Vec::new();
    read_stepwise(r, &mut meta, header.meta_len as usize, "message").map_err(|e| (id, e))?;
    read_stepwise(r, payload, header.payload_len as usize, "payload").map_err(|e| (id, e))?;
    let request = decode::<Request>(&meta).map_err(|e| (id, e))?;
    // One numbering: the header's opcode is the request's own (crate::facts).
    if request.opcode() != header.opcode {
        return Err((
            id,
            CodecError::Frame(FrameError::Opcode {
                header: header.opcode,
                request: request.name(),
            }),
        ));
    }
    Ok(Some(RequestFrame { header, request }))
}

/// Sends an error reply for a frame that could not be handled.
pub fn write_error<W: Write>(
    w: &mut W,
    opcode: u16,
    request_id: u64,
    code: ErrorCode,
    message: String,
) -> io::Result<()> {
    write_response(
        w,
        opcode,
        request_id,
        &Response::Error(ErrorReply::new(code, message)),
        &[],
    )
}

/// A received response frame (async side).
pub struct ResponseFrame {
    pub header: Header,
    pub response: Response,
    pub payload: Vec<u8>,
}

/// Reads one response frame from an async stream. `Err(Closed)` on a clean close.
pub async fn read_response<R: AsyncRead + Unpin>(r: &mut R) -> Result<ResponseFrame, CodecError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut hb[got..]).await?;
        if n == 0 {
            return Err(if got == 0 {
                CodecError::Closed
            } else {
                CodecError::Truncated("header")
            });
        }
        got += n;
    }
    let header = Header::decode(&hb).map_err(|(_, e)| CodecError::Frame(e))?;
    let meta = read_async(r, header.meta_len as usize, "message").await?;
    let payload = read_async(r, header.payload_len as usize, "payload").await?;
    let response = decode::<Response>(&meta)?;
    Ok(ResponseFrame {
        header,
        response,
        payload,
    })
}

/// Reads `len` bytes into a new buffer whose pages are touched only as the bytes arrive.
async fn read_async<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    what: &'static str,
) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        match (&mut *r).take(want).read_buf(&mut buf).await {
            Ok(0) | Err(_) => return Err(CodecError::Truncated(what)),
            Ok(_) => {}
        }
    }
    Ok(buf)
}

/// Writes one request frame to an async stream.
pub async fn write_request<W: AsyncWrite + Unpin>(
    w: &mut W,
    request_id: u64,
    session: u32,
    req: &Request,
    payload: &[u8],
) -> io::Result<()> {
    let meta = encode(req)?;
    let prefix = frame_prefix_as(req.opcode(), request_id, session, &meta, payload.len());
    if payload.is_empty() {
        w.write_all(&prefix).await?;
    } else {
        w.write_all(&prefix).await?;
        w.write_all(payload).await?;
    }
    w.flush().await
}

/// Sends one request and reads its reply on a blocking stream (one request in flight).
pub fn call_blocking<S: Read + Write>(
    s: &mut S,
    request_id: u64,
    session: u32,
    req: &Request,
    payload: &[u8],
) -> Result<ResponseFrame, CodecError> {
    let meta = encode(req)?;
    let prefix = frame_prefix_as(req.opcode(), request_id, session, &meta, payload.len());
    write_all_vectored(s, &prefix, payload)?;
    let mut hb = [0u8; HEADER_LEN];
    if !read_exact_or_eof(s, &mut hb, "header")? {
        return Err(CodecError::Closed);
    }
    let header = Header::decode(&hb).map_err(|(_, e)| CodecError::Frame(e))?;
    let mut meta = Vec::new();
    read_stepwise(s, &mut meta, header.meta_len as usize, "message")?;
    let mut payload = Vec::new();
    read_stepwise(s, &mut payload, header.payload_len as usize, "payload")?;
    let response = decode::<Response>(&meta)?;
    Ok(ResponseFrame {
        header,
        response,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MAGIC;
    use surge_core::{FileId, InstanceId, NamespaceId};

    fn write_req() -> Request {
        Request::Write {
            instance: InstanceId(3),
            fragment: 1,
            file: FileId {
                ns: NamespaceId(0),
                ino: 42,
            },
            offset: 8 << 20,
        }
    }

    #[test]
    fn request_round_trip_with_payload() {
        let req = write_req();
        let meta = encode(&req).expect("encodes");
        let mut wire = frame_prefix(req.opcode(), 77, &meta, 5);
        wire.extend_from_slice(b"hello");
        let mut payload = Vec::new();
        let f = read_request(&mut &wire[..], &mut payload)
            .ok()
            .flatten()
            .expect("frame");
        assert_eq!(f.request, req);
        assert_eq!(f.header.request_id, 77);
        assert_eq!(payload, b"hello");
    }

    #[test]
    fn a_header_naming_another_operation_is_refused() {
        let req = write_req();
        let meta = encode(&req).expect("encodes");
        let read_op = crate::facts::RequestKind::Read.opcode();
        let wire = frame_prefix(read_op, 3, &meta, 0);
        let mut p = Vec::new();
        match read_request(&mut &wire[..], &mut p) {
            Err((Some(3), CodecError::Frame(FrameError::Opcode { header, request }))) => {
                assert_eq!((header, request), (read_op, "Write"));
            }
            other => panic!("expected an opcode mismatch, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors_not_panics() {
        let req = write_req();
        let meta = encode(&req).expect("encodes");
        let mut wire = frame_prefix(req.opcode(), 1, &meta, 5);
        wire.extend_from_slice(b"hel");
        let mut p = Vec::new();
        assert!(matches!(
            read_request(&mut &wire[..], &mut p),
            Err((Some(1), CodecError::Truncated("payload")))
        ));
        // A valid header whose message is garbage.
        let mut wire = frame_prefix(16, 2, &[0xff; 9], 0);
        assert!(matches!(
            read_request(&mut &wire[..], &mut p),
            Err((Some(2), CodecError::Decode(_)))
        ));
        wire.truncate(10);
        assert!(matches!(
            read_request(&mut &wire[..], &mut p),
            Err((None, CodecError::Truncated("header")))
        ));
        let mut junk = [0u8; 64];
        junk[..4].copy_from_slice(b"GET ");
        assert!(matches!(
            read_request(&mut &junk[..], &mut p),
            Err((_, CodecError::Frame(FrameError::BadMagic(_))))
        ));
        assert_ne!(&junk[..4], &MAGIC);
    }

    #[tokio::test]
    async fn response_round_trip_async() {
        let mut wire = Vec::new();
        write_response(&mut wire, 17, 9, &Response::Data, b"abc").unwrap();
        let f = read_response(&mut &wire[..]).await.unwrap();
        assert_eq!(f.response, Response::Data);
        assert_eq!(f.payload, b"abc");
        assert!(f.header.is_response());
        assert_eq!(f.header.request_id, 9);
    }
}
