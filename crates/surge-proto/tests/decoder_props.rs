//! Properties of the frame and message decoder over arbitrary input (a short run of what the
//! `fuzz/` targets explore for minutes): it never panics, what it accepts round-trips, and the
//! memory it takes follows the bytes that arrived, not the lengths a header announced.

use proptest::prelude::*;
use surge_proto::codec::{decode, encode, frame_prefix, read_request, CodecError};
use surge_proto::frame::{Header, HEADER_LEN, MAX_META, MAX_PAYLOAD, PROTOCOL_VERSION, READ_STEP};
use surge_proto::{Request, Response};

/// A header that passes validation, with the given lengths, then `body`.
fn framed(opcode: u16, id: u64, meta_len: u32, payload_len: u32, body: &[u8]) -> Vec<u8> {
    let mut w = Header::request(opcode, id, meta_len, payload_len)
        .encode()
        .to_vec();
    w.extend_from_slice(body);
    w
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes: an error or a frame, never a panic; a decoded request encodes back to a
    /// frame that decodes to the same request.
    #[test]
    fn arbitrary_bytes_never_panic_and_accepted_requests_round_trip(
        bytes in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        let mut payload = Vec::new();
        if let Ok(Some(f)) = read_request(&mut &bytes[..], &mut payload) {
            let meta = encode(&f.request).expect("encodes");
            let mut again = frame_prefix(f.request.opcode(), f.header.request_id, &meta, payload.len());
            again.extend_from_slice(&payload);
            let mut p2 = Vec::new();
            let g = read_request(&mut &again[..], &mut p2).ok().flatten();
            prop_assert_eq!(g.map(|g| g.request), Some(f.request));
            prop_assert_eq!(p2, payload);
        }
        let _ = decode::<Response>(&bytes);
        let _ = decode::<Request>(&bytes);
    }

    /// A valid header followed by arbitrary message bytes (the decoder's real surface: what
    /// follows a header that passed validation).
    #[test]
    fn arbitrary_messages_behind_a_valid_header_never_panic(
        opcode in any::<u16>(),
        meta in proptest::collection::vec(any::<u8>(), 0..256),
        payload_len in 0u32..64,
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = framed(opcode, 7, meta.len() as u32, payload_len, &meta);
        wire.extend(std::iter::repeat_n(0xa5, payload_len as usize));
        let keep = cut.index(wire.len() + 1);
        let mut payload = Vec::new();
        match read_request(&mut &wire[..keep], &mut payload) {
            Ok(Some(f)) => prop_assert_eq!(f.header.request_id, 7),
            Ok(None) => prop_assert_eq!(keep, 0),
            Err((id, e)) => {
                // Once the header is whole, the error names the request.
                prop_assert_eq!(id.is_some(), keep >= HEADER_LEN, "{}", e);
            }
        }
    }

    /// A frame that announces up to the limits and sends only `sent` bytes: the buffers the
    /// reader took hold at most what was sent plus one read step.
    #[test]
    fn memory_follows_the_bytes_that_arrived(
        meta_len in 0u32..=MAX_META,
        payload_len in 0u32..=MAX_PAYLOAD,
        sent in 0usize..(3 << 20),
    ) {
        let mut wire = framed(16, 1, meta_len, payload_len, &[]);
        wire.resize(HEADER_LEN + sent.min((meta_len + payload_len) as usize), 0);
        let mut payload = Vec::new();
        let r = read_request(&mut &wire[..], &mut payload);
        if (sent as u64) < u64::from(meta_len) + u64::from(payload_len) {
            let truncated = matches!(r, Err((Some(1), CodecError::Truncated(_))));
            prop_assert!(truncated);
        }
        prop_assert!(payload.len() <= sent + READ_STEP);
    }

    /// Headers: every field survives encoding; anything over the limits or of another
    /// version is refused with the request id.
    #[test]
    fn headers_round_trip_or_are_refused_with_their_id(
        version in any::<u16>(),
        opcode in any::<u16>(),
        id in any::<u64>(),
        meta_len in any::<u32>(),
        payload_len in any::<u32>(),
        flags in any::<u32>(),
        session in any::<u32>(),
    ) {
        let h = Header { version, opcode, request_id: id, meta_len, payload_len, flags, session };
        match Header::decode(&h.encode()) {
            Ok(d) => {
                prop_assert_eq!(d, h);
                prop_assert!(version == PROTOCOL_VERSION && meta_len <= MAX_META && payload_len <= MAX_PAYLOAD);
            }
            Err((got, _)) => {
                prop_assert_eq!(got, id);
                prop_assert!(version != PROTOCOL_VERSION || meta_len > MAX_META || payload_len > MAX_PAYLOAD);
            }
        }
    }
}
