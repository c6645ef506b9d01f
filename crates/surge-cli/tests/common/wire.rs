//! Speaking the data protocol by hand, as a foreign or hostile client would: raw frames over
//! TCP, replies read without the client library.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use surge_proto::codec::{encode, frame_prefix};
use surge_proto::frame::{Header, HEADER_LEN};
use surge_proto::{ErrorCode, Request, Response};

/// A connection to `addr` that has presented an administrator's capability (made with the test
/// process's cluster key), as Surge's own tools do before anything else.
pub fn connect(addr: &str) -> TcpStream {
    let mut s = connect_anonymous(addr);
    authenticate(&mut s, &surge_testkit::admin_token());
    s
}

/// A connection to `addr` that has presented nothing.
pub fn connect_anonymous(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Presents `token` on clear connection `s` (request id 0), as Surge's clients do (see
/// `surge_auth::Token::present`); panics unless the server accepts it.
pub fn authenticate(s: &mut TcpStream, token: &surge_auth::Token) {
    let req = Request::Authenticate {
        token: token.present(b""),
    };
    match call(s, 0, &req, &[]).0 {
        Response::Ok => {}
        other => panic!("Authenticate answered {other:?}"),
    }
}

/// Sends `req` with request id `id` and `payload`.
pub fn send(s: &mut TcpStream, id: u64, req: &Request, payload: &[u8]) {
    let mut w = frame_prefix(
        req.opcode(),
        id,
        &encode(req).expect("encodes"),
        payload.len(),
    );
    w.extend_from_slice(payload);
    s.write_all(&w).unwrap();
}

/// Reads one response frame with its payload; None if the server closed the connection.
pub fn read_frame(s: &mut TcpStream) -> Option<(Header, Response, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    if s.read_exact(&mut hb).is_err() {
        return None;
    }
    let h = Header::decode(&hb).expect("server sent a valid header");
    let mut meta = vec![0u8; h.meta_len as usize];
    s.read_exact(&mut meta).unwrap();
    let mut payload = vec![0u8; h.payload_len as usize];
    s.read_exact(&mut payload).unwrap();
    let resp = surge_proto::codec::decode(&meta).expect("decodable response");
    Some((h, resp, payload))
}

/// Reads one response frame; None if the server closed the connection.
pub fn read_response(s: &mut TcpStream) -> Option<(Header, Response)> {
    read_frame(s).map(|(h, r, _)| (h, r))
}

/// Sends `req` and reads its reply.
pub fn call(s: &mut TcpStream, id: u64, req: &Request, payload: &[u8]) -> (Response, Vec<u8>) {
    send(s, id, req, payload);
    let (h, r, p) = read_frame(s).expect("a reply");
    assert_eq!(h.request_id, id, "reply to another request: {r:?}");
    (r, p)
}

/// True when the server closed the connection (a read returns end of file or a reset).
pub fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0))
        || matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
}

pub fn error_code(r: Option<(Header, Response)>) -> ErrorCode {
    match r {
        Some((_, Response::Error(e))) => e.code,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

/// Panics unless the server at `addr` answers `Status` on a new connection.
pub fn alive(addr: &str) {
    let mut s = connect(addr);
    send(&mut s, 1, &Request::Status, &[]);
    match read_response(&mut s) {
        Some((_, Response::Status(_))) => {}
        other => panic!("server did not answer Status: {other:?}"),
    }
}

/// A process's resident memory and its peak, in bytes (`VmRSS`, `VmHWM`).
pub fn memory(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let kib = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
            * 1024
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}
