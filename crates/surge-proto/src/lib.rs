//! Surge's data and metadata protocol (DESIGN §3): length-delimited binary frames with a fixed
//! header ([`frame`]), small typed messages encoded with `postcard` ([`msg`]), bulk bytes carried
//! out of band in the frame payload, and byte-stream [`transport`]s (TCP, Unix sockets).
//!
//! Every request gets exactly one response frame with the same request id, so requests can be
//! pipelined on one connection. A failed request is answered with `Response::Error` carrying a
//! typed [`msg::ErrorCode`]; a frame that cannot be parsed is answered (when its id is known) and
//! the connection closed.

pub mod codec;
pub mod facts;
pub mod frame;
pub mod msg;
pub mod preload;
pub mod record;
pub mod tls;
pub mod transport;
pub mod unix;

pub use codec::CodecError;
pub use facts::{Change, Dirs, Facts, Owners, RequestKind, Scope, Sender, Service};
pub use frame::{Header, PROTOCOL_VERSION};
pub use msg::*;
pub use transport::{Addr, SocketTransport, Transport};
