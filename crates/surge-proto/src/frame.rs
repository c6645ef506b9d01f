//! The frame: a fixed 32-byte header, then `meta_len` bytes of encoded message, then
//! `payload_len` bytes of bulk data that is never serialized (DESIGN §3).
//!
//! ```text
//! 0      4        6        8             16         20            24        28        32
//! | SRGE | version| opcode | request id  | meta len | payload len | flags   | session |
//! ```
//! All integers little-endian. `session` names the client a request acts for (a mount; 0 for
//! none): the metadata server grants directory leases to sessions (see `Request::LeaseDir`). A response carries the request's id and opcode with
//! [`RESPONSE_BIT`] set, so a client can match replies to pipelined requests.

use thiserror::Error;

pub const MAGIC: [u8; 4] = *b"SRGE";
/// Bumped on any incompatible change of the header or of the messages.
pub const PROTOCOL_VERSION: u16 = 15;
pub const HEADER_LEN: usize = 32;
/// Set in the opcode of every response.
pub const RESPONSE_BIT: u16 = 0x8000;
/// Largest encoded message we accept. Messages are small (a readdir page of 4096 entries with
/// attributes, the largest, is about 1.3 MiB).
pub const MAX_META: u32 = 4 << 20;
/// Largest read or write of one request: a `Read` asks for at most this many bytes and a
/// `Write` carries at most this many (clients send 8 MiB at most, `surge-client` `MAX_PIECE`).
pub const MAX_IO: u32 = 16 << 20;
/// Largest bulk payload we accept in one frame: one read's or one write's bytes.
pub const MAX_PAYLOAD: u32 = MAX_IO;
/// A frame's message and payload are read in steps of at most this many bytes, so a peer that
/// announces a large frame and stalls holds this much memory, not what it announced.
pub const READ_STEP: usize = 1 << 20;
// Limits that must hold together (checked when the crate compiles, not when a peer sends).
// A step never exceeds what one frame may carry, so reading in steps ends.
const _: () =
    assert!(READ_STEP as u64 <= MAX_META as u64 && READ_STEP as u64 <= MAX_PAYLOAD as u64);
// A `SetXattr` carries its name and value in the message: the largest must fit in one.
const _: () =
    assert!(crate::msg::XATTR_SIZE_MAX + crate::msg::XATTR_NAME_MAX + 4096 <= MAX_META as usize);
// The largest attribute fits in what one inode may hold.
const _: () =
    assert!(crate::msg::XATTR_SIZE_MAX + crate::msg::XATTR_NAME_MAX <= crate::msg::XATTR_INODE_MAX);

/// The request id of a frame about the connection rather than a request: a server that refuses
/// a connection (`ErrorCode::ConnectionLimit`) or closes an idle one (`ErrorCode::IdleClosed`)
/// says so in a response with this id. Clients number their requests from 1.
pub const CONNECTION_ID: u64 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub opcode: u16,
    pub request_id: u64,
    pub meta_len: u32,
    pub payload_len: u32,
    pub flags: u32,
    /// The client session a request acts for (0: none); 0 in responses.
    pub session: u32,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {0:02x?}: not a Surge peer")]
    BadMagic([u8; 4]),
    #[error("protocol version {found} not supported (this side speaks {PROTOCOL_VERSION})")]
    Version { found: u16 },
    #[error("message of {0} bytes exceeds the {MAX_META}-byte limit")]
    MetaTooLarge(u32),
    #[error("payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    PayloadTooLarge(u32),
    /// A frame larger than [`MAX_ANONYMOUS`] on a connection that has not authenticated.
    #[error(
        "frame of {0} bytes on a connection that has not presented a capability (at most \
         {MAX_ANONYMOUS} bytes before Authenticate)"
    )]
    Anonymous(u64),
    /// A request whose header names another operation than its message (one numbering:
    /// [`crate::facts::RequestKind`]).
    #[error("the header's opcode {header} is not that of the {request} request it carries")]
    Opcode { header: u16, request: &'static str },
}

/// The largest frame (message and payload) a server reads from a connection that has not yet
/// presented a capability: an `Authenticate` and a few small requests fit, and a stranger's
/// connections cannot make the server hold [`MAX_PAYLOAD`] each.
pub const MAX_ANONYMOUS: u64 = 64 * 1024;

impl Header {
    pub fn request(opcode: u16, request_id: u64, meta_len: u32, payload_len: u32) -> Header {
        Header {
            version: PROTOCOL_VERSION,
            opcode,
            request_id,
            meta_len,
            payload_len,
            flags: 0,
            session: 0,
        }
    }

    pub fn is_response(&self) -> bool {
        self.opcode & RESPONSE_BIT != 0
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&self.opcode.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.meta_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.flags.to_le_bytes());
        b[28..32].copy_from_slice(&self.session.to_le_bytes());
        b
    }

    /// Decodes and validates a header. The request id is returned even for a header that fails
    /// validation, so the peer can be told which request was refused.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, (u64, FrameError)> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        let request_id = u64::from_le_bytes(id);
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err((request_id, FrameError::BadMagic(magic)));
        }
        let h = Header {
            version: u16_at(4),
            opcode: u16_at(6),
            request_id,
            meta_len: u32_at(16),
            payload_len: u32_at(20),
            flags: u32_at(24),
            session: u32_at(28),
        };
        if h.version != PROTOCOL_VERSION {
            return Err((request_id, FrameError::Version { found: h.version }));
        }
        if h.meta_len > MAX_META {
            return Err((request_id, FrameError::MetaTooLarge(h.meta_len)));
        }
        if h.payload_len > MAX_PAYLOAD {
            return Err((request_id, FrameError::PayloadTooLarge(h.payload_len)));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let mut h = Header::request(7, 0xdead_beef, 12, 4096);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        h.session = 0x1234_5678;
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn bad_magic_version_and_lengths_are_refused() {
        let mut b = Header::request(1, 9, 0, 0).encode();
        b[0] = b'X';
        assert!(matches!(
            Header::decode(&b),
            Err((9, FrameError::BadMagic(_)))
        ));

        let mut h = Header::request(1, 9, 0, 0);
        h.version = 99;
        assert_eq!(
            Header::decode(&h.encode()),
            Err((9, FrameError::Version { found: 99 }))
        );

        let h = Header::request(1, 9, MAX_META + 1, 0);
        assert!(matches!(
            Header::decode(&h.encode()),
            Err((9, FrameError::MetaTooLarge(_)))
        ));
        let h = Header::request(1, 9, 0, MAX_PAYLOAD + 1);
        assert!(matches!(
            Header::decode(&h.encode()),
            Err((9, FrameError::PayloadTooLarge(_)))
        ));
    }
}
