//! The server's frame and request decoder over arbitrary bytes (what any peer can send), and the
//! client's response decoder (what a server sends back): errors, never panics, and memory that
//! follows the bytes present.
#![no_main]

use libfuzzer_sys::fuzz_target;
use surge_proto::codec::{decode, read_request};
use surge_proto::frame::{Header, HEADER_LEN, READ_STEP};
use surge_proto::Response;

fuzz_target!(|data: &[u8]| {
    // A stream of frames, read until the first error or the end, reusing the payload buffer as
    // the server does.
    let mut rest = data;
    let mut payload = Vec::new();
    while let Ok(Some(_frame)) = read_request(&mut rest, &mut payload) {
        assert!(payload.len() <= data.len());
    }
    assert!(payload.capacity() <= 2 * (data.len() + READ_STEP));
    // The same bytes as a response's header and message.
    if data.len() >= HEADER_LEN {
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&data[..HEADER_LEN]);
        let _ = Header::decode(&hb);
        let _ = decode::<Response>(&data[HEADER_LEN..]);
    }
    let _ = decode::<Response>(data);
});
