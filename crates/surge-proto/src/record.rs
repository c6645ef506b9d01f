//! The TLS 1.3 record layer of the data protocol (RFC 8446 §5), after rustls's handshake.
//!
//! rustls does the handshake: it verifies the server's certificate against the CA and derives
//! the channel binding (`crate::tls::binding`). Then the connection's traffic keys are taken
//! out of it ([`take_keys`], rustls's `dangerous_extract_secrets`) and records are sealed and
//! opened here, in this module's buffers: a record read from the socket is decrypted where it
//! lies ([`Opener`]), and plaintext is encrypted where it is sent from ([`Sealer`]); a file's
//! bytes are read straight into the records that carry them ([`Stream::write_file`], a
//! server's reply to a read, which in TLS has no `sendfile`). rustls's
//! buffered API copies each received record twice more (into a new `Vec`, then out of it),
//! which on a 2-vCPU host cost more than the cipher (docs/SECURITY.md, "What it costs").
//!
//! On the wire this is TLS 1.3 as any peer speaks it (tests: a rustls peer on the other end,
//! both ways). A record that fails authentication (tampered, replayed, reordered, from
//! someone else), that is longer than 2^14+256 bytes, that is not application data or that
//! arrives after its sequence numbers ran out fails the connection, for good: every later
//! read fails too. A `close_notify` alert reads as the end of the stream; a socket that ends
//! without one is `UnexpectedEof` (a truncation is never taken for a clean end). After the
//! handshake, `NewSessionTicket` messages are ignored (resumption is not used).
//!
//! Keys are updated as RFC 8446 §4.6.3 says, so a connection can carry any amount of data: a
//! [`Sealer`] sends a `KeyUpdate` and moves to the next generation of its traffic secret every
//! [`REKEY_AFTER`] records, well before AES-GCM's limit (§5.5); an [`Opener`] that receives one
//! moves its own direction to the next generation, and when the peer asks for an update in
//! return, the sealer of the same connection sends one before its next record. The traffic
//! secrets the generations are derived from are not in what rustls hands out
//! (`dangerous_extract_secrets` gives keys only): rustls's key log gives them, for this
//! connection alone ([`TrafficSecrets`]), and [`take_keys`] checks that they give the keys
//! rustls extracted.
//!
//! Nonces never repeat: each direction's [`Sealer`] and [`Opener`] are the only holders of
//! its key, each record takes the next sequence number, and a direction whose numbers are
//! exhausted refuses to seal or open anything more.

use ring::{aead, hkdf};
use rustls::ConnectionTrafficSecrets;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Bytes of a record's header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// Most plaintext bytes one record carries (RFC 8446 §5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Most bytes of a protected record's body (RFC 8446 §5.2).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Bytes of the AEAD tag of every suite `crate::tls` offers.
const TAG_LEN: usize = 16;
/// Plaintext sealed per write to the socket: large writes go out in pieces this big.
pub const SEND_CHUNK: usize = 128 * 1024;
/// Bytes of socket data a receiver holds: a read of this much, plus room for one record that
/// began in the previous read.
const RECV_BUF: usize = 128 * 1024 + HEADER_LEN + MAX_CIPHERTEXT;
/// Bytes a record adds to its plaintext: header, content type, tag.
const RECORD_OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
/// Bytes of a blocking [`Stream`]'s send buffer: [`SEND_CHUNK`] of plaintext in records, after
/// a `KeyUpdate`'s record.
const SEND_BUF: usize =
    RECORD_OVERHEAD + 5 + SEND_CHUNK + SEND_CHUNK.div_ceil(MAX_PLAINTEXT) * RECORD_OVERHEAD;
/// Records a [`Sealer`] seals under one key before it sends a `KeyUpdate` and moves to the
/// next: half of the 2^24 full records RFC 8446 §5.5 allows AES-GCM per key (2^23 records
/// of 16 KiB are 128 GiB).
pub const REKEY_AFTER: u64 = 1 << 23;
/// `KeyUpdate`s a peer may send in a row with no application data between them (as rustls
/// and BoringSSL): each costs a derivation, so an endless run of them is refused.
const MAX_UPDATES_IN_A_ROW: u32 = 32;
/// Most bytes of a traffic secret (the output of SHA-384, the longest hash of a suite).
const MAX_SECRET: usize = 48;
/// Most bytes of a traffic key (AES-256, ChaCha20).
const MAX_KEY: usize = 32;

const _: () = assert!(MAX_PLAINTEXT + 1 + TAG_LEN <= MAX_CIPHERTEXT);
const _: () = assert!(MAX_CIPHERTEXT <= u16::MAX as usize);
const _: () = assert!(RECV_BUF >= 2 * (HEADER_LEN + MAX_CIPHERTEXT));
const _: () = assert!(REKEY_AFTER < 1 << 24);

// Content types (RFC 8446 §5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
// Alert and post-handshake messages this layer knows (RFC 8446 §6, §4.6).
const CLOSE_NOTIFY: u8 = 0;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
// A KeyUpdate's one byte (RFC 8446 §4.6.3).
const UPDATE_NOT_REQUESTED: u8 = 0;
const UPDATE_REQUESTED: u8 = 1;

fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {}", why.into()))
}

/// The application traffic secrets of one connection (RFC 8446 §7.1), as rustls's key
/// schedule logs them: a `rustls::KeyLog` installed in a copy of the configuration made for
/// this connection alone (`crate::tls::ClientTls::connection`, `ServerTls::connection`).
/// [`take_keys`] takes them; nothing else is kept.
#[derive(Default)]
pub struct TrafficSecrets {
    /// The client's secret, then the server's.
    logged: Mutex<[Option<Vec<u8>>; 2]>,
}

impl TrafficSecrets {
    const LABELS: [&'static str; 2] = ["CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"];

    /// The client's and the server's secrets, taken out.
    fn take(&self) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        match [logged[0].take(), logged[1].take()] {
            [Some(client), Some(server)] => Ok((client, server)),
            _ => Err(refused(
                "the handshake gave no traffic secrets (was the connection made with \
                 ClientTls::connection or ServerTls::connection?)",
            )),
        }
    }
}

impl std::fmt::Debug for TrafficSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TrafficSecrets(..)")
    }
}

impl rustls::KeyLog for TrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if let Some(i) = Self::LABELS.iter().position(|l| *l == label) {
            self.logged.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(secret.to_vec());
        }
    }

    fn will_log(&self, label: &str) -> bool {
        Self::LABELS.contains(&label)
    }
}

/// A cipher suite, as the record layer uses it: its AEAD and the hash of its key schedule.
#[derive(Clone, Copy)]
struct Suite {
    aead: &'static aead::Algorithm,
    hkdf: hkdf::Algorithm,
}

impl Suite {
    /// The suite whose keys rustls extracted, and those keys: (suite, key, IV).
    fn of(secrets: &ConnectionTrafficSecrets) -> io::Result<(Suite, &[u8], &[u8])> {
        let (aead, hkdf, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&aead::AES_128_GCM, hkdf::HKDF_SHA256, key, iv)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&aead::AES_256_GCM, hkdf::HKDF_SHA384, key, iv)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, hkdf::HKDF_SHA256, key, iv)
            }
            _ => {
                return Err(refused(
                    "the peer chose a cipher suite Surge does not offer",
                ))
            }
        };
        Ok((Suite { aead, hkdf }, key.as_ref(), iv.as_ref()))
    }

    /// Bytes of a traffic secret: the hash's output.
    fn secret_len(&self) -> usize {
        hkdf::KeyType::len(&self.hkdf)
    }

    /// HKDF-Expand-Label(`secret`, `label`, "", `out.len()`) (RFC 8446 §7.1) into `out`.
    fn expand_label(&self, secret: &[u8], label: &[u8], out: &mut [u8]) -> io::Result<()> {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        debug_assert!(out.len() <= u16::MAX as usize && label.len() <= 255 - 6);
        let length = (out.len() as u16).to_be_bytes();
        let label_len = [(b"tls13 ".len() + label.len()) as u8];
        let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &[0]];
        hkdf::Prk::new_less_safe(self.hkdf, secret)
            .expand(&info, Len(out.len()))
            .and_then(|okm| okm.fill(out))
            .map_err(|_| {
                refused(format!(
                    "deriving a traffic {}",
                    String::from_utf8_lossy(label)
                ))
            })
    }
}

/// A traffic secret and what is derived from it (RFC 8446 §7.3): key and IV.
struct Generation {
    secret: [u8; MAX_SECRET],
    key: [u8; MAX_KEY],
    iv: [u8; aead::NONCE_LEN],
}

impl Generation {
    fn new(suite: Suite, secret: &[u8]) -> io::Result<Generation> {
        if secret.len() != suite.secret_len() {
            return Err(refused(format!(
                "a traffic secret of {} bytes for a hash of {}",
                secret.len(),
                suite.secret_len()
            )));
        }
        let mut g = Generation {
            secret: [0; MAX_SECRET],
            key: [0; MAX_KEY],
            iv: [0; aead::NONCE_LEN],
        };
        g.secret[..secret.len()].copy_from_slice(secret);
        suite.expand_label(secret, b"key", &mut g.key[..suite.aead.key_len()])?;
        suite.expand_label(secret, b"iv", &mut g.iv)?;
        Ok(g)
    }

    /// The next generation (RFC 8446 §7.2): the secret is
    /// HKDF-Expand-Label(this secret, "traffic upd", "", Hash.length).
    fn next(&self, suite: Suite) -> io::Result<Generation> {
        let len = suite.secret_len();
        let mut secret = [0; MAX_SECRET];
        suite.expand_label(&self.secret[..len], b"traffic upd", &mut secret[..len])?;
        Generation::new(suite, &secret[..len])
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Best effort: a secret of a past generation does not outlive its use in this memory.
        self.secret.fill(0);
        self.key.fill(0);
    }
}

/// One direction's generation of keys, and the sequence number of its next record.
struct Direction {
    suite: Suite,
    generation: Generation,
    key: aead::LessSafeKey,
    seq: u64,
}

impl Direction {
    /// The keys of `generation` of `suite`, from sequence number `seq`.
    fn of(suite: Suite, generation: Generation, seq: u64) -> io::Result<Direction> {
        debug_assert_eq!(suite.aead.tag_len(), TAG_LEN);
        let key = aead::UnboundKey::new(suite.aead, &generation.key[..suite.aead.key_len()])
            .map_err(|_| refused("a traffic key of the wrong length"))?;
        Ok(Direction {
            suite,
            generation,
            key: aead::LessSafeKey::new(key),
            seq,
        })
    }

    /// The next generation of this direction's keys, from sequence number 0 (RFC 8446 §4.6.3).
    fn next(&self) -> io::Result<Direction> {
        Direction::of(self.suite, self.generation.next(self.suite)?, 0)
    }

    /// The nonce of the next record (RFC 8446 §5.3): the IV XOR its sequence number, which
    /// is used up. Fails, for good, once the numbers run out: a nonce is never used twice.
    fn next_nonce(&mut self) -> io::Result<aead::Nonce> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| refused("record sequence numbers exhausted"))?;
        let mut nonce = self.generation.iv;
        for (n, s) in nonce[aead::NONCE_LEN - 8..]
            .iter_mut()
            .zip(seq.to_be_bytes())
        {
            *n ^= s;
        }
        Ok(aead::Nonce::assume_unique_for_key(nonce))
    }
}

/// The sending direction: seals plaintext into records.
pub struct Sealer {
    dir: Direction,
    /// Set by the [`Opener`] of the same connection when the peer asked for an update
    /// (`update_requested`): one is sent before the next record.
    update_asked: Arc<AtomicBool>,
    /// Records sealed under one key before the next `KeyUpdate` ([`REKEY_AFTER`]).
    rekey_after: u64,
}

impl Sealer {
    /// Sends a `KeyUpdate` every `records` records instead of every [`REKEY_AFTER`] (tests).
    #[cfg(test)]
    pub(crate) fn set_rekey_after(&mut self, records: u64) {
        assert!((1..=REKEY_AFTER).contains(&records));
        self.rekey_after = records;
    }

    /// Appends to `out` records carrying the bytes of `bufs`, in order, at most `max` bytes
    /// of them; returns how many bytes it took.
    pub fn seal<B: Deref<Target = [u8]>>(
        &mut self,
        bufs: &[B],
        max: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<usize> {
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(max);
        out.reserve(total + total.div_ceil(MAX_PLAINTEXT) * RECORD_OVERHEAD);
        let (mut i, mut off, mut taken) = (0, 0, 0);
        while taken < total {
            self.update_if_due(out)?;
            let start = Self::begin(out);
            let mut room = MAX_PLAINTEXT.min(total - taken);
            while room > 0 {
                let b = &bufs[i][off..];
                let n = b.len().min(room);
                out.extend_from_slice(&b[..n]);
                (room, taken, off) = (room - n, taken + n, off + n);
                if off == bufs[i].len() {
                    (i, off) = (i + 1, 0);
                }
            }
            self.finish(out, start, APPLICATION_DATA)?;
        }
        Ok(taken)
    }

    /// Before a record: when this key has sealed its share, or the peer asked for an update,
    /// appends a `KeyUpdate` (`update_not_requested`) sealed with the key it retires, and
    /// moves to the next generation (RFC 8446 §4.6.3).
    fn update_if_due(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        // A load first: the swap's write is for the rare record that owes an update.
        let asked = self.update_asked.load(Ordering::Acquire)
            && self.update_asked.swap(false, Ordering::AcqRel);
        if !asked && self.dir.seq < self.rekey_after {
            return Ok(());
        }
        let updated = self.dir.next().and_then(|next| {
            let msg = [KEY_UPDATE, 0, 0, 1, UPDATE_NOT_REQUESTED];
            self.seal_message(HANDSHAKE, &msg, out)?;
            Ok(next)
        });
        match updated {
            Ok(next) => {
                self.dir = next;
                Ok(())
            }
            Err(e) => {
                // Still owed to the peer: the next attempt sends it.
                self.update_asked.fetch_or(asked, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Appends a `close_notify` alert to `out`: the peer reads the end of the stream.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        self.seal_message(ALERT, &[1, CLOSE_NOTIFY], out)
    }

    /// Appends one record of content type `ctype` carrying `data` (at most [`MAX_PLAINTEXT`]).
    fn seal_message(&mut self, ctype: u8, data: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        debug_assert!(data.len() <= MAX_PLAINTEXT);
        let start = Self::begin(out);
        out.extend_from_slice(data);
        self.finish(out, start, ctype)
    }

    /// Starts a record at the end of `out`: its header, length to come.
    fn begin(out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
        start
    }

    /// Seals the record begun at `start` (its plaintext follows the header) in place.
    fn finish(&mut self, out: &mut Vec<u8>, start: usize, ctype: u8) -> io::Result<()> {
        out.resize(out.len() + 1 + TAG_LEN, 0);
        let sealed = self.seal_record(&mut out[start..], ctype);
        if sealed.is_err() {
            out.truncate(start);
        }
        sealed
    }

    /// Seals `record` in place: a header, the plaintext, then room for the content type and
    /// the tag. Writes the header, the content type, the ciphertext and the tag.
    fn seal_record(&mut self, record: &mut [u8], ctype: u8) -> io::Result<()> {
        let body = record.len() - HEADER_LEN;
        debug_assert!((1 + TAG_LEN..=MAX_CIPHERTEXT).contains(&body));
        let [b0, b1] = (body as u16).to_be_bytes();
        let (header, text) = record.split_at_mut(HEADER_LEN);
        header.copy_from_slice(&[APPLICATION_DATA, 3, 3, b0, b1]);
        let (text, tag) = text.split_at_mut(body - TAG_LEN);
        text[body - TAG_LEN - 1] = ctype;
        let nonce = self.dir.next_nonce()?;
        let sealed = self
            .dir
            .key
            .seal_in_place_separate_tag(nonce, aead::Aad::from(&header[..]), text)
            .map_err(|_| refused("sealing a record failed"))?;
        tag.copy_from_slice(sealed.as_ref());
        Ok(())
    }

    /// Seals up to `len` bytes of plaintext (at most [`SEND_CHUNK`]) into records laid out in
    /// `buf` (at least [`SEND_BUF`] bytes long), after a `KeyUpdate` when one is due. `fill`
    /// writes the plaintext where it is sealed: it is given the records' payloads, in order,
    /// and fills them all. Returns how many bytes of plaintext were taken (fewer than `len`
    /// where the key changes before the end) and how many bytes of `buf` are to be sent.
    pub fn seal_into(
        &mut self,
        len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [IoSliceMut<'_>]) -> io::Result<()>,
    ) -> io::Result<(usize, usize)> {
        debug_assert!(len <= SEND_CHUNK && buf.len() >= SEND_BUF);
        let mut update = Vec::new();
        self.update_if_due(&mut update)?;
        buf[..update.len()].copy_from_slice(&update);
        let mut at = update.len();
        // Records this key may still seal: at least one (the update above saw to that).
        let room = usize::try_from(self.rekey_after.saturating_sub(self.dir.seq))
            .unwrap_or(usize::MAX)
            .max(1);
        let taken = len.min(room.saturating_mul(MAX_PLAINTEXT));
        let sizes = (0..taken.div_ceil(MAX_PLAINTEXT))
            .map(|r| MAX_PLAINTEXT.min(taken - r * MAX_PLAINTEXT));
        {
            let mut slots = Vec::with_capacity(SEND_CHUNK.div_ceil(MAX_PLAINTEXT));
            let mut rest = &mut buf[at..];
            for n in sizes.clone() {
                let (record, tail) = rest.split_at_mut(n + RECORD_OVERHEAD);
                slots.push(IoSliceMut::new(&mut record[HEADER_LEN..HEADER_LEN + n]));
                rest = tail;
            }
            fill(&mut slots)?;
        }
        for n in sizes {
            let end = at + n + RECORD_OVERHEAD;
            self.seal_record(&mut buf[at..end], APPLICATION_DATA)?;
            at = end;
        }
        Ok((taken, at))
    }
}

/// Copies the bytes of `bufs`, in order, into `slots`, as many as they hold.
fn copy_into(slots: &mut [IoSliceMut<'_>], bufs: &[IoSlice<'_>]) {
    let mut slots = slots.iter_mut();
    let mut slot: &mut [u8] = &mut [];
    for b in bufs {
        let mut b = &b[..];
        while !b.is_empty() {
            if slot.is_empty() {
                match slots.next() {
                    Some(s) => slot = s,
                    None => return,
                }
            }
            let n = b.len().min(slot.len());
            slot[..n].copy_from_slice(&b[..n]);
            slot = &mut std::mem::take(&mut slot)[n..];
            b = &b[n..];
        }
    }
}

/// Fills `slots` with the bytes from `pos` on of `head` followed by `file`'s from `offset`;
/// zeros for bytes the file does not hold (it was truncated since its length was taken).
fn fill_from_file(
    mut slots: &mut [IoSliceMut<'_>],
    head: &[u8],
    file: &std::fs::File,
    offset: u64,
    pos: usize,
) -> io::Result<()> {
    let mut rest = head.get(pos..).unwrap_or_default();
    while !rest.is_empty() && !slots.is_empty() {
        let n = rest.len().min(slots[0].len());
        slots[0][..n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
        IoSliceMut::advance_slices(&mut slots, n);
    }
    let from = offset + pos.saturating_sub(head.len()) as u64;
    let got = surge_core::sys::read_vectored_full_at(file, slots, from)?;
    IoSliceMut::advance_slices(&mut slots, got);
    for s in slots.iter_mut() {
        s.fill(0);
    }
    Ok(())
}

/// The receiving direction: socket bytes in, decrypted in place, plaintext out.
pub struct Opener {
    dir: Direction,
    buf: Vec<u8>,
    /// Decrypted bytes not yet given out: `buf[plain.0..plain.1]`, before `raw`.
    plain: (usize, usize),
    /// Bytes from the socket not yet opened: `buf[raw.0..raw.1]`.
    raw: (usize, usize),
    /// The peer sent `close_notify`: the stream has ended.
    closed: bool,
    /// Why the connection failed; every read after that fails the same way.
    failed: Option<String>,
    /// Shared with the [`Sealer`] of the same connection: set when the peer asks for an
    /// update of our keys.
    update_asked: Arc<AtomicBool>,
    /// `KeyUpdate`s received since the last application data ([`MAX_UPDATES_IN_A_ROW`]).
    updates_in_a_row: u32,
}

impl Opener {
    fn new(dir: Direction, update_asked: Arc<AtomicBool>) -> Opener {
        Opener {
            dir,
            buf: Vec::new(),
            plain: (0, 0),
            raw: (0, 0),
            closed: false,
            failed: None,
            update_asked,
            updates_in_a_row: 0,
        }
    }

    /// True when bytes wait here (decrypted, or read from the socket and not yet opened).
    pub fn buffered(&self) -> bool {
        self.plain.0 < self.plain.1 || self.raw.0 < self.raw.1
    }

    /// Gives up to `room` decrypted bytes to `take`, opening the whole records already read;
    /// `Some(0)` at the end of the stream, `None` when the socket must be read first.
    fn deliver(&mut self, room: usize, mut take: impl FnMut(&[u8])) -> io::Result<Option<usize>> {
        if let Some(why) = &self.failed {
            return Err(refused(why.clone()));
        }
        if room == 0 {
            return Ok(Some(0));
        }
        let mut n = 0;
        while n < room {
            if self.plain.0 == self.plain.1 {
                match self.open_next() {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        self.failed = Some(e.to_string());
                        // Bytes already given out were authentic; the failure comes next.
                        return if n > 0 { Ok(Some(n)) } else { Err(e) };
                    }
                }
            }
            let k = (self.plain.1 - self.plain.0).min(room - n);
            take(&self.buf[self.plain.0..self.plain.0 + k]);
            self.plain.0 += k;
            n += k;
        }
        Ok(if n > 0 {
            Some(n)
        } else if self.closed {
            Some(0)
        } else {
            None
        })
    }

    /// Where the next socket read goes: after the bytes not yet opened, with room for at
    /// least a whole record (a partial one is moved to the front first).
    fn space(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.plain.0, self.plain.1, "read the socket only when dry");
        if self.buf.is_empty() {
            self.buf = vec![0u8; RECV_BUF];
        }
        if self.raw.0 == self.raw.1 {
            self.raw = (0, 0);
        } else if self.buf.len() - self.raw.0 < HEADER_LEN + MAX_CIPHERTEXT {
            self.buf.copy_within(self.raw.0..self.raw.1, 0);
            self.raw = (0, self.raw.1 - self.raw.0);
        }
        self.plain = (self.raw.0, self.raw.0);
        &mut self.buf[self.raw.1..]
    }

    /// `n` bytes were read into [`Opener::space`].
    fn filled(&mut self, n: usize) {
        debug_assert!(self.raw.1 + n <= self.buf.len());
        self.raw.1 += n;
    }

    /// The error of a socket that ended: it did so without `close_notify` (a clean end is
    /// seen before the socket is read again).
    fn ended(&mut self) -> io::Error {
        let why = if self.raw.0 < self.raw.1 {
            "the peer closed the connection in the middle of a record"
        } else {
            "the peer closed the connection without close_notify"
        };
        self.failed = Some(why.into());
        io::Error::new(io::ErrorKind::UnexpectedEof, format!("TLS: {why}"))
    }

    /// Opens the next whole record read: true when it was opened (it may carry no data),
    /// false when none is whole yet or the stream has ended.
    fn open_next(&mut self) -> io::Result<bool> {
        let (start, end) = self.raw;
        if self.closed || end - start < HEADER_LEN {
            return Ok(false);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&self.buf[start..start + HEADER_LEN]);
        if header[0] != APPLICATION_DATA {
            return Err(refused(format!(
                "a record of type {} after the handshake",
                header[0]
            )));
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len > MAX_CIPHERTEXT {
            return Err(refused(format!(
                "a record of {len} bytes (record_overflow)"
            )));
        }
        if len < 1 + TAG_LEN {
            return Err(refused(format!("a record of {len} bytes: too short")));
        }
        if end - start < HEADER_LEN + len {
            return Ok(false);
        }
        let body = start + HEADER_LEN..start + HEADER_LEN + len;
        let nonce = self.dir.next_nonce()?;
        let inner_len = self
            .dir
            .key
            .open_in_place(nonce, aead::Aad::from(header), &mut self.buf[body.clone()])
            .map_err(|_| {
                refused(
                    "a record failed authentication (altered, replayed, reordered, or not \
                     from the peer)",
                )
            })?
            .len();
        self.raw.0 = body.end;
        // The inner plaintext: content, its type, zeros of padding.
        let inner = &self.buf[body.start..body.start + inner_len];
        let Some(t) = inner.iter().rposition(|&b| b != 0) else {
            return Err(refused("a record without a content type"));
        };
        if t > MAX_PLAINTEXT {
            return Err(refused(
                "a record of more than 2^14 bytes (record_overflow)",
            ));
        }
        match inner[t] {
            APPLICATION_DATA => {
                self.plain = (body.start, body.start + t);
                self.updates_in_a_row = 0;
            }
            ALERT if t == 2 && inner[1] == CLOSE_NOTIFY => self.closed = true,
            ALERT if t == 2 => return Err(refused(format!("the peer sent alert {}", inner[1]))),
            HANDSHAKE => {
                if let Some(requested) = post_handshake(&inner[..t])? {
                    self.key_update(requested)?;
                }
            }
            other => return Err(refused(format!("a record of content type {other}"))),
        }
        Ok(true)
    }

    /// The peer sent a `KeyUpdate`: the records after it are sealed with the next generation
    /// of its keys; when it asks for an update of ours, the [`Sealer`] sends one.
    fn key_update(&mut self, requested: bool) -> io::Result<()> {
        self.updates_in_a_row += 1;
        if self.updates_in_a_row > MAX_UPDATES_IN_A_ROW {
            return Err(refused(format!(
                "more than {MAX_UPDATES_IN_A_ROW} KeyUpdates with no data between them"
            )));
        }
        self.dir = self.dir.next()?;
        if requested {
            self.update_asked.store(true, Ordering::Release);
        }
        Ok(())
    }
}

/// Handshake messages after the handshake (RFC 8446 §4.6), each whole in one record: tickets
/// are ignored (Surge does not resume sessions); a `KeyUpdate` ends its record (the keys
/// change after it, §5.1) and is returned: `Some(true)` when the peer asks for ours too.
/// Anything else fails.
fn post_handshake(mut msgs: &[u8]) -> io::Result<Option<bool>> {
    let mut update = None;
    while !msgs.is_empty() {
        if update.is_some() {
            return Err(refused(
                "a KeyUpdate followed by more in the same record (unexpected_message)",
            ));
        }
        if msgs.len() < 4 {
            return Err(refused("a handshake message split across records"));
        }
        let len = u32::from_be_bytes([0, msgs[1], msgs[2], msgs[3]]) as usize;
        if msgs.len() - 4 < len {
            return Err(refused("a handshake message split across records"));
        }
        let (body, rest) = msgs[4..].split_at(len);
        match msgs[0] {
            NEW_SESSION_TICKET => {}
            KEY_UPDATE => {
                update = Some(match body {
                    [UPDATE_NOT_REQUESTED] => false,
                    [UPDATE_REQUESTED] => true,
                    _ => {
                        return Err(refused(format!(
                            "a malformed KeyUpdate ({len} bytes: {body:02x?}; decode_error)"
                        )))
                    }
                })
            }
            t => {
                return Err(refused(format!(
                    "handshake message {t} after the handshake"
                )))
            }
        }
        msgs = rest;
    }
    Ok(update)
}

/// Both directions of a connection's record protection.
pub type Keys = (Opener, Sealer);

/// Takes the traffic keys out of `conn`, whose handshake is complete and which holds no
/// records unread or unsent (see [`handshake`]), and the traffic secrets `secrets` its
/// key log kept (see [`TrafficSecrets`]); rustls is done with the connection.
pub fn take_keys(mut conn: rustls::Connection, secrets: &TrafficSecrets) -> io::Result<Keys> {
    let state = conn.process_new_packets().map_err(io::Error::other)?;
    if conn.is_handshaking() || state.plaintext_bytes_to_read() > 0 || conn.wants_write() {
        return Err(refused(
            "records left in rustls at the end of the handshake",
        ));
    }
    let (client, server) = secrets.take()?;
    let (tx_secret, rx_secret) = match conn {
        rustls::Connection::Client(_) => (client, server),
        rustls::Connection::Server(_) => (server, client),
    };
    let keys = conn
        .dangerous_extract_secrets()
        .map_err(|e| refused(format!("taking the traffic keys: {e}")))?;
    let tx = direction(&keys.tx, &tx_secret)?;
    let rx = direction(&keys.rx, &rx_secret)?;
    Ok(pair(rx, tx))
}

/// The direction of traffic secret `secret`, whose keys rustls extracted as `(seq, keys)`:
/// refused unless the secret gives those keys (a secret logged for another connection, or
/// for another generation, would be found out here, not at the peer).
fn direction(
    (seq, keys): &(u64, ConnectionTrafficSecrets),
    secret: &[u8],
) -> io::Result<Direction> {
    let (suite, key, iv) = Suite::of(keys)?;
    let g = Generation::new(suite, secret)?;
    if g.key[..suite.aead.key_len()] != *key || g.iv[..] != *iv {
        return Err(refused(
            "the traffic secret rustls logged does not give the keys it extracted",
        ));
    }
    Direction::of(suite, g, *seq)
}

/// The two directions of one connection, joined: the opener tells the sealer when the peer
/// asks for an update of its keys.
fn pair(rx: Direction, tx: Direction) -> Keys {
    let update_asked = Arc::new(AtomicBool::new(false));
    (
        Opener::new(rx, update_asked.clone()),
        Sealer {
            dir: tx,
            update_asked,
            rekey_after: REKEY_AFTER,
        },
    )
}

/// The length of the record whose header is `h`, refused above what any record may be.
fn record_len(h: &[u8; HEADER_LEN]) -> io::Result<usize> {
    let len = u16::from_be_bytes([h[3], h[4]]) as usize;
    if len > MAX_CIPHERTEXT {
        return Err(refused(format!(
            "a record of {len} bytes (record_overflow)"
        )));
    }
    Ok(len)
}

/// Gives rustls one record read from the socket; on a failure, sends its alert.
fn feed<W: Write>(conn: &mut rustls::Connection, record: &[u8], alerts: &mut W) -> io::Result<()> {
    let mut rest = record;
    while !rest.is_empty() {
        conn.read_tls(&mut rest)?;
    }
    if let Err(e) = conn.process_new_packets() {
        while conn.wants_write() && conn.write_tls(alerts).is_ok_and(|n| n > 0) {}
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    Ok(())
}

/// Runs `conn`'s handshake on `sock`, reading one record at a time, so that nothing after
/// the handshake's last record is read (the record layer takes over exactly there).
pub fn handshake<S: Read + Write>(conn: &mut rustls::Connection, sock: &mut S) -> io::Result<()> {
    let mut record = Vec::new();
    loop {
        while conn.wants_write() {
            conn.write_tls(sock)?;
        }
        if !conn.is_handshaking() {
            return sock.flush();
        }
        let mut h = [0u8; HEADER_LEN];
        sock.read_exact(&mut h)?;
        let len = record_len(&h)?;
        record.clear();
        record.extend_from_slice(&h);
        record.resize(HEADER_LEN + len, 0);
        sock.read_exact(&mut record[HEADER_LEN..])?;
        feed(conn, &record, sock)?;
    }
}

/// [`handshake`] on an async socket.
pub async fn handshake_async<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut rustls::Connection,
    sock: &mut S,
) -> io::Result<()> {
    let mut record = Vec::new();
    let mut out = Vec::new();
    loop {
        while conn.wants_write() {
            out.clear();
            conn.write_tls(&mut out)?;
            sock.write_all(&out).await?;
        }
        if !conn.is_handshaking() {
            return sock.flush().await;
        }
        let mut h = [0u8; HEADER_LEN];
        sock.read_exact(&mut h).await?;
        let len = record_len(&h)?;
        record.clear();
        record.extend_from_slice(&h);
        record.resize(HEADER_LEN + len, 0);
        sock.read_exact(&mut record[HEADER_LEN..]).await?;
        out.clear();
        let fed = feed(conn, &record, &mut out);
        if fed.is_err() {
            let _ = sock.write_all(&out).await;
        }
        fed?;
    }
}

/// A TLS connection on a blocking socket `sock` (both directions).
pub struct Stream<S> {
    pub sock: S,
    opener: Opener,
    sealer: Sealer,
    /// Where records are sealed and sent from ([`SEND_BUF`] bytes, once the first is sent).
    out: Vec<u8>,
    /// A write to the socket failed part way: the records sent no longer follow each other.
    broken: bool,
}

impl<S> Stream<S> {
    pub fn new(sock: S, (opener, sealer): Keys) -> Stream<S> {
        Stream {
            sock,
            opener,
            sealer,
            out: Vec::new(),
            broken: false,
        }
    }

    /// True when received bytes wait here: a read may not need the socket.
    pub fn buffered(&self) -> bool {
        self.opener.buffered()
    }
}

impl<S: Write> Stream<S> {
    /// Sends `close_notify`: the peer reads the end of the stream.
    pub fn close_notify(&mut self) -> io::Result<()> {
        let mut alert = Vec::new();
        self.sealer.close_notify(&mut alert)?;
        send(&mut self.sock, &mut self.broken, &alert)
    }

    /// Sends `head`, then `len` bytes of `file` from `offset`, zeros for any it no longer
    /// holds (a file truncated meanwhile: a frame keeps the length its header announced).
    /// The file's bytes are read straight into the records that carry them and encrypted
    /// there: one copy through this process (file to send buffer) where `write` makes two.
    pub fn write_file(
        &mut self,
        head: &[u8],
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> io::Result<()> {
        let total = head.len() + len;
        let mut pos = 0;
        while pos < total {
            let want = (total - pos).min(SEND_CHUNK);
            let fill =
                |slots: &mut [IoSliceMut<'_>]| fill_from_file(slots, head, file, offset, pos);
            pos += self.seal_and_send(want, fill)?;
        }
        Ok(())
    }

    /// Seals up to `len` bytes that `fill` writes in place ([`Sealer::seal_into`]) and sends
    /// them; returns how many it took.
    fn seal_and_send(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [IoSliceMut<'_>]) -> io::Result<()>,
    ) -> io::Result<usize> {
        if self.out.len() < SEND_BUF {
            self.out = vec![0; SEND_BUF];
        }
        let (taken, used) = self.sealer.seal_into(len, &mut self.out, fill)?;
        send(&mut self.sock, &mut self.broken, &self.out[..used])?;
        Ok(taken)
    }
}

/// Writes sealed records to `sock`; once a write failed part way (`broken`), nothing more:
/// the records after it would no longer follow the ones the peer has.
fn send<S: Write>(sock: &mut S, broken: &mut bool, records: &[u8]) -> io::Result<()> {
    if *broken {
        return Err(refused("an earlier write failed part way"));
    }
    let sent = sock.write_all(records);
    *broken = sent.is_err();
    sent
}

impl<S: Read> Read for Stream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut n = 0;
            let got = self.opener.deliver(buf.len(), |p| {
                buf[n..n + p.len()].copy_from_slice(p);
                n += p.len();
            })?;
            if let Some(n) = got {
                return Ok(n);
            }
            let read = self.sock.read(self.opener.space())?;
            if read == 0 {
                return Err(self.opener.ended());
            }
            self.opener.filled(read);
        }
    }
}

impl<S: Write> Write for Stream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let len = bufs.iter().map(|b| b.len()).sum::<usize>().min(SEND_CHUNK);
        if len == 0 {
            return Ok(0);
        }
        self.seal_and_send(len, |slots| {
            copy_into(slots, bufs);
            Ok(())
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// The receiving half of a TLS connection on an async socket.
pub struct ReadHalf<R> {
    inner: R,
    opener: Opener,
}

impl<R> ReadHalf<R> {
    pub fn new(inner: R, opener: Opener) -> ReadHalf<R> {
        ReadHalf { inner, opener }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for ReadHalf<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this
                .opener
                .deliver(buf.remaining(), |p| buf.put_slice(p))?
                .is_some()
            {
                return Poll::Ready(Ok(()));
            }
            let mut space = ReadBuf::new(this.opener.space());
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut space))?;
            let read = space.filled().len();
            if read == 0 {
                return Poll::Ready(Err(this.opener.ended()));
            }
            this.opener.filled(read);
        }
    }
}

/// The sending half of a TLS connection on an async socket. Records wait here until a flush,
/// or until [`SEND_CHUNK`] bytes wait: a frame's header and payload leave in one write.
pub struct WriteHalf<W> {
    inner: W,
    sealer: Sealer,
    out: Vec<u8>,
    sent: usize,
    closing: bool,
}

impl<W> WriteHalf<W> {
    pub fn new(inner: W, sealer: Sealer) -> WriteHalf<W> {
        WriteHalf {
            inner,
            sealer,
            out: Vec::new(),
            sent: 0,
            closing: false,
        }
    }
}

impl<W: AsyncWrite + Unpin> WriteHalf<W> {
    /// Writes the records waiting here to the socket.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WriteHalf<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.len() - this.sent >= SEND_CHUNK {
            ready!(this.poll_send(cx))?;
        }
        Poll::Ready(this.sealer.seal(&[buf], SEND_CHUNK, &mut this.out))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.closing {
            this.closing = true;
            this.sealer.close_notify(&mut this.out)?;
        }
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AES-256-GCM with SHA-384 (the other suites meet rustls in `interop`).
    const SUITE: Suite = Suite {
        aead: &aead::AES_256_GCM,
        hkdf: hkdf::HKDF_SHA384,
    };

    /// One direction whose traffic secret is made of byte `k`, from sequence number `seq`.
    fn direction(k: u8, seq: u64) -> Direction {
        Direction::of(SUITE, Generation::new(SUITE, &[k; 48]).unwrap(), seq).unwrap()
    }

    /// The two ends of a connection: A sends with secret 1, B with secret 2.
    fn ends() -> (Keys, Keys) {
        let a = pair(direction(2, 0), direction(1, 0));
        let b = pair(direction(1, 0), direction(2, 0));
        (a, b)
    }

    /// A socket whose reads give `input` at most `chunk` bytes at a time and whose writes
    /// are kept in `output`.
    #[derive(Default)]
    struct Wire {
        input: Vec<u8>,
        pos: usize,
        chunk: usize,
        output: Vec<u8>,
    }

    impl Read for Wire {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk).min(self.input.len() - self.pos);
            buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    impl Write for Wire {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn wire(input: Vec<u8>, chunk: usize) -> Wire {
        Wire {
            input,
            chunk,
            ..Wire::default()
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The records of `wire`, split at their headers.
    fn records(mut wire: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !wire.is_empty() {
            let len = u16::from_be_bytes([wire[3], wire[4]]) as usize;
            out.push(wire[..HEADER_LEN + len].to_vec());
            wire = &wire[HEADER_LEN + len..];
        }
        out
    }

    /// Reads `s` to its end (or error), `step` bytes at a time at most.
    fn read_all<S: Read>(s: &mut Stream<S>, step: usize) -> (Vec<u8>, io::Result<()>) {
        let mut got = Vec::new();
        let mut b = vec![0u8; step];
        loop {
            match s.read(&mut b) {
                Ok(0) => return (got, Ok(())),
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) => return (got, Err(e)),
            }
        }
    }

    /// What A sends when it writes `msgs` and closes.
    fn sent(msgs: &[&[u8]]) -> Vec<u8> {
        let (a, _) = ends();
        let mut a = Stream::new(Wire::default(), a);
        for m in msgs {
            a.write_all(m).unwrap();
        }
        a.close_notify().unwrap();
        a.sock.output
    }

    #[test]
    fn bytes_written_are_read_back_in_order_in_records_of_at_most_2_14_bytes() {
        let big = data(1 << 20);
        let (a, b) = ends();
        let mut a = Stream::new(Wire::default(), a);
        a.write_all(b"hello").unwrap();
        let head = [1u8, 2, 3];
        let n = a
            .write_vectored(&[IoSlice::new(&head), IoSlice::new(&big)])
            .unwrap();
        a.write_all(&big[n - head.len()..]).unwrap();
        a.close_notify().unwrap();
        for r in records(&a.sock.output) {
            assert_eq!(
                &r[..3],
                &[APPLICATION_DATA, 3, 3],
                "looks like application data"
            );
            assert!(r.len() - HEADER_LEN <= MAX_PLAINTEXT + 1 + TAG_LEN);
        }
        let mut b = Stream::new(wire(a.sock.output, usize::MAX), b);
        let (got, end) = read_all(&mut b, 100_000);
        end.unwrap();
        let mut want = b"hello".to_vec();
        want.extend_from_slice(&head);
        want.extend_from_slice(&big);
        assert!(got == want);
    }

    #[test]
    fn a_record_split_across_socket_reads_is_opened_whole() {
        let msg = data(100_000);
        let bytes = sent(&[&msg]);
        for chunk in [1, 7, 4096, 16_405, 70_001] {
            let (_, b) = ends();
            let mut b = Stream::new(wire(bytes.clone(), chunk), b);
            let (got, end) = read_all(&mut b, 5000);
            end.unwrap();
            assert!(got == msg, "chunk {chunk}");
        }
    }

    #[test]
    fn an_altered_record_fails_the_connection_for_good() {
        let good = sent(&[b"first record", b"second record"]);
        // A flipped bit in the ciphertext, the tag or the header (the AAD) of the second.
        let second = records(&good)[0].len();
        for at in [
            second + 2,
            second + HEADER_LEN,
            second + HEADER_LEN + 3,
            good.len() - 40,
        ] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            let (_, b) = ends();
            let mut b = Stream::new(wire(bad, usize::MAX), b);
            let mut buf = [0u8; 64];
            assert_eq!(b.read(&mut buf).unwrap(), 12, "the first record is intact");
            let e = b.read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "byte {at}: {e}");
            assert!(b.read(&mut buf).is_err(), "and stays failed");
        }
    }

    #[test]
    fn a_replayed_or_reordered_record_is_refused() {
        let r = records(&sent(&[b"one", b"two"]));
        for order in [[1, 0], [0, 0]] {
            let bytes = [r[order[0]].clone(), r[order[1]].clone()].concat();
            let (_, b) = ends();
            let mut b = Stream::new(wire(bytes, usize::MAX), b);
            let mut buf = [0u8; 8];
            let first = b.read(&mut buf);
            let second = b.read(&mut buf);
            match order {
                [1, 0] => assert!(first.is_err(), "out of order"),
                _ => {
                    assert_eq!(first.unwrap(), 3);
                    assert!(second.is_err(), "replayed");
                }
            }
        }
    }

    #[test]
    fn an_oversized_or_clear_record_is_refused_before_its_body_is_read() {
        let mut over = vec![APPLICATION_DATA, 3, 3];
        over.extend_from_slice(&((MAX_CIPHERTEXT + 1) as u16).to_be_bytes());
        let clear = vec![HANDSHAKE, 3, 3, 0, 4, 1, 2, 3, 4];
        for bytes in [over, clear] {
            let (_, b) = ends();
            let mut b = Stream::new(wire(bytes, usize::MAX), b);
            let e = b.read(&mut [0u8; 8]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
    }

    #[test]
    fn sequence_numbers_never_wrap_and_a_nonce_is_never_reused() {
        let (_, mut a) = pair(direction(2, 0), direction(1, u64::MAX - 1));
        a.rekey_after = u64::MAX;
        let mut out = Vec::new();
        a.seal(&[&b"last"[..]], usize::MAX, &mut out).unwrap();
        let len = out.len();
        assert!(a.seal(&[&b"one more"[..]], usize::MAX, &mut out).is_err());
        assert!(a.close_notify(&mut out).is_err());
        assert_eq!(out.len(), len, "nothing sealed once the numbers ran out");
        let b = pair(direction(1, u64::MAX - 1), direction(2, 0));
        let mut b = Stream::new(wire([out.clone(), out].concat(), usize::MAX), b);
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap(), 4);
        assert!(b.read(&mut buf).is_err());
    }

    #[test]
    fn close_notify_is_the_end_and_a_bare_close_is_not() {
        let (_, b) = ends();
        let mut b = Stream::new(wire(sent(&[b"all of it"]), usize::MAX), b);
        let (got, end) = read_all(&mut b, 64);
        assert_eq!((got.as_slice(), end.is_ok()), (&b"all of it"[..], true));
        assert_eq!(b.read(&mut [0u8; 8]).unwrap(), 0, "the end stays the end");

        let r = records(&sent(&[b"cut"]));
        let (_, b) = ends();
        let mut b = Stream::new(wire(r[0].clone(), usize::MAX), b);
        let (got, end) = read_all(&mut b, 64);
        assert_eq!(got, b"cut");
        assert_eq!(end.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    /// What a peer sends to update its keys: a `KeyUpdate` sealed with its current key
    /// (`request`: asking for ours too), then it moves to the next generation.
    fn send_update(sealer: &mut Sealer, request: u8, out: &mut Vec<u8>) {
        let next = sealer.dir.next().unwrap();
        let msg = [KEY_UPDATE, 0, 0, 1, request];
        sealer.seal_message(HANDSHAKE, &msg, out).unwrap();
        sealer.dir = next;
    }

    /// Moves what `from` sent to what `to` reads, `chunk` bytes per socket read.
    fn carry(from: &mut Stream<Wire>, to: &mut Stream<Wire>, chunk: usize) {
        to.sock.input.drain(..to.sock.pos);
        to.sock.pos = 0;
        to.sock.input.append(&mut from.sock.output);
        to.sock.chunk = chunk;
    }

    #[test]
    fn a_ticket_is_ignored_and_a_key_update_followed() {
        let (a, b) = ends();
        let (_, mut sealer) = a;
        let mut out = Vec::new();
        sealer
            .seal_message(HANDSHAKE, &[NEW_SESSION_TICKET, 0, 0, 2, 9, 9], &mut out)
            .unwrap();
        sealer.seal(&[&b"data"[..]], usize::MAX, &mut out).unwrap();
        send_update(&mut sealer, UPDATE_NOT_REQUESTED, &mut out);
        sealer.seal(&[&b"more"[..]], usize::MAX, &mut out).unwrap();
        let mut b = Stream::new(wire(out, usize::MAX), b);
        let mut buf = [0u8; 4];
        assert_eq!(b.read(&mut buf).unwrap(), 4);
        assert_eq!(
            b.read(&mut buf).unwrap(),
            4,
            "read with the next generation"
        );
        assert_eq!(&buf, b"more");
        assert!(!b.sealer.update_asked.load(Ordering::Acquire), "not asked");
    }

    #[test]
    fn keys_move_to_the_next_generation_every_few_records_in_both_directions() {
        let (a, b) = ends();
        let (mut a, mut b) = (
            Stream::new(Wire::default(), a),
            Stream::new(Wire::default(), b),
        );
        a.sealer.set_rekey_after(3);
        b.sealer.set_rekey_after(5);
        let big = data(1 << 20);
        // Lengths that end records anywhere, socket reads that split them anywhere.
        for (round, chunk) in [usize::MAX, 7, 4096, 16_405, 70_001]
            .into_iter()
            .enumerate()
        {
            let msg = &big[round * 1001..];
            a.write_all(msg).unwrap();
            if round == 0 {
                let sent = records(&a.sock.output).len();
                let data = msg.len().div_ceil(MAX_PLAINTEXT);
                assert_eq!(
                    sent - data,
                    (data - 1) / 3,
                    "a KeyUpdate after each 3 records"
                );
            }
            carry(&mut a, &mut b, chunk);
            let mut got = vec![0u8; msg.len()];
            b.read_exact(&mut got).unwrap();
            assert!(got == msg, "A to B, round {round}");
            b.write_all(&got).unwrap();
            carry(&mut b, &mut a, chunk);
            a.read_exact(&mut got).unwrap();
            assert!(got == msg, "B to A, round {round}");
            assert!(a.sealer.dir.seq <= 3 && b.sealer.dir.seq <= 5);
        }
        a.close_notify().unwrap();
        carry(&mut a, &mut b, 1);
        assert_eq!(
            b.read(&mut [0u8; 8]).unwrap(),
            0,
            "the end, read with the last keys"
        );
    }

    #[test]
    fn an_update_the_peer_asks_for_is_sent_before_the_next_data_and_once() {
        let (a, b) = ends();
        let (mut a, mut b) = (
            Stream::new(Wire::default(), a),
            Stream::new(Wire::default(), b),
        );
        let mut out = Vec::new();
        send_update(&mut a.sealer, UPDATE_REQUESTED, &mut out);
        a.write_all(b"ping").unwrap();
        send_update(&mut a.sealer, UPDATE_REQUESTED, &mut out);
        send_update(&mut a.sealer, UPDATE_REQUESTED, &mut out);
        a.write_all(b"ping").unwrap();
        // The updates were sealed before the data they precede.
        let pings = std::mem::take(&mut a.sock.output);
        let r = records(&out);
        let p = records(&pings);
        a.sock.output = [&r[0][..], &p[0], &r[1], &r[2], &p[1]].concat();
        carry(&mut a, &mut b, usize::MAX);
        let mut got = [0u8; 8];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pingping");
        assert!(b.sealer.update_asked.load(Ordering::Acquire), "asked");
        b.write_all(b"pong").unwrap();
        assert_eq!(
            records(&b.sock.output).len(),
            2,
            "one KeyUpdate, then the data"
        );
        b.write_all(b"pong").unwrap();
        assert_eq!(records(&b.sock.output).len(), 3, "and no more");
        carry(&mut b, &mut a, usize::MAX);
        a.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pongpong");
        assert!(
            !a.sealer.update_asked.load(Ordering::Acquire),
            "an answer asks nothing"
        );
    }

    #[test]
    fn a_malformed_key_update_fails_the_connection_for_good() {
        let bad: [&[u8]; 5] = [
            &[KEY_UPDATE, 0, 0, 0],
            &[KEY_UPDATE, 0, 0, 2, 0, 0],
            &[KEY_UPDATE, 0, 0, 1, 2],
            &[KEY_UPDATE, 0, 0, 2, 0],
            // Not the last message of its record: what follows it would be under the old key.
            &[KEY_UPDATE, 0, 0, 1, 0, NEW_SESSION_TICKET, 0, 0, 0],
        ];
        for msg in bad {
            let ((_, mut sealer), b) = ends();
            let mut out = Vec::new();
            sealer.seal(&[&b"data"[..]], usize::MAX, &mut out).unwrap();
            sealer.seal_message(HANDSHAKE, msg, &mut out).unwrap();
            let mut b = Stream::new(wire(out, usize::MAX), b);
            let mut buf = [0u8; 8];
            assert_eq!(b.read(&mut buf).unwrap(), 4);
            let e = b.read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{msg:?}: {e}");
            assert!(b.read(&mut buf).is_err(), "{msg:?}: and stays failed");
            assert!(!b.sealer.update_asked.load(Ordering::Acquire));
        }
    }

    #[test]
    fn an_endless_run_of_key_updates_is_refused() {
        for (updates, refused) in [
            (MAX_UPDATES_IN_A_ROW, false),
            (MAX_UPDATES_IN_A_ROW + 1, true),
        ] {
            let ((_, mut sealer), b) = ends();
            let mut out = Vec::new();
            sealer.seal(&[&b"data"[..]], usize::MAX, &mut out).unwrap();
            for _ in 0..updates {
                send_update(&mut sealer, UPDATE_REQUESTED, &mut out);
            }
            sealer.seal(&[&b"more"[..]], usize::MAX, &mut out).unwrap();
            let mut b = Stream::new(wire(out, usize::MAX), b);
            let mut buf = [0u8; 4];
            assert_eq!(b.read(&mut buf).unwrap(), 4);
            let second = b.read(&mut buf);
            assert_eq!(second.is_err(), refused, "{updates} in a row: {second:?}");
        }
    }

    #[test]
    fn a_file_is_sent_in_records_it_is_read_straight_into_with_zeros_past_its_end() {
        let path = std::env::temp_dir().join(format!("surge-record-file-{}", std::process::id()));
        let content = data(300_000);
        std::fs::write(&path, &content).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let head = b"a frame's header and message";
        // Whole records, a key update every 3 records, and a file shorter than asked for.
        for (offset, len, rekey) in [
            (1234, 200_000, REKEY_AFTER),
            (7, 250_000, 3),
            (290_000, 40_000, 2),
        ] {
            let (a, b) = ends();
            let (mut a, mut b) = (
                Stream::new(Wire::default(), a),
                Stream::new(Wire::default(), b),
            );
            a.sealer.set_rekey_after(rekey);
            a.write_file(head, &file, offset, len).unwrap();
            a.write_all(b"next").unwrap();
            for r in records(&a.sock.output) {
                assert!(r.len() - HEADER_LEN <= MAX_PLAINTEXT + 1 + TAG_LEN);
            }
            carry(&mut a, &mut b, 4096);
            let mut got = vec![0u8; head.len() + len + 4];
            b.read_exact(&mut got).unwrap();
            let mut want = head.to_vec();
            let from = (offset as usize).min(content.len());
            let to = (offset as usize + len).min(content.len());
            want.extend_from_slice(&content[from..to]);
            want.resize(head.len() + len, 0);
            want.extend_from_slice(b"next");
            assert!(got == want, "{offset} {len} {rekey}");
        }
    }

    /// Interoperation with rustls on the other end (a TLS 1.3 peer that is not this module).
    mod interop {
        use super::super::*;
        use crate::tls::{ClientTls, Mode, ServerTls};
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        use std::os::unix::net::UnixStream;
        use std::sync::Arc;

        struct Pki {
            dir: std::path::PathBuf,
            cert: CertificateDer<'static>,
            key: PrivateKeyDer<'static>,
        }

        /// A certificate for `localhost`, in files (for `crate::tls`) and in memory.
        fn pki(tag: &str) -> Pki {
            let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
            let dir =
                std::env::temp_dir().join(format!("surge-record-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("server.crt"), ck.cert.pem()).unwrap();
            std::fs::write(dir.join("server.key"), ck.signing_key.serialize_pem()).unwrap();
            Pki {
                dir,
                cert: ck.cert.der().clone(),
                key: PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()).into(),
            }
        }

        fn name() -> rustls::pki_types::ServerName<'static> {
            ClientTls::server_name("localhost").unwrap()
        }

        /// Plain rustls, as any TLS 1.3 peer would configure it (tickets sent, no extraction).
        fn plain_server(p: &Pki) -> Arc<rustls::ServerConfig> {
            let c = rustls::ServerConfig::builder_with_provider(ring())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![p.cert.clone()], p.key.clone_key())
                .unwrap();
            assert!(c.send_tls13_tickets > 0);
            Arc::new(c)
        }

        /// Plain rustls offering only `suite`.
        fn plain_client(p: &Pki, suite: rustls::SupportedCipherSuite) -> Arc<rustls::ClientConfig> {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(p.cert.clone()).unwrap();
            let mut provider = rustls::crypto::ring::default_provider();
            provider.cipher_suites = vec![suite];
            Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(provider))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            )
        }

        fn ring() -> Arc<rustls::crypto::CryptoProvider> {
            Arc::new(rustls::crypto::ring::default_provider())
        }

        /// Reads `n` bytes and writes them back, updating its keys (and asking for ours)
        /// before each [`PIECE`]; then reads to the end of the stream.
        fn echo<C, S>(s: &mut rustls::StreamOwned<C, S>, n: usize) -> usize
        where
            C: std::ops::DerefMut<
                Target = rustls::ConnectionCommon<rustls::server::ServerConnectionData>,
            >,
            S: Read + Write,
        {
            let mut got = vec![0u8; n];
            s.read_exact(&mut got).unwrap();
            for piece in got.chunks(PIECE) {
                s.conn.refresh_traffic_keys().unwrap();
                s.write_all(piece).unwrap();
            }
            s.flush().unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            rest.len()
        }

        const N: usize = 3 << 20;
        /// Bytes rustls sends between two updates of its keys.
        const PIECE: usize = 100_000;
        /// Records our side seals between two updates of its keys.
        const OUR_REKEY: u64 = 5;

        #[test]
        fn a_rustls_client_speaks_to_our_server_side_in_every_suite_across_key_updates() {
            let p = pki("server");
            let ours = Arc::new(
                ServerTls::from_files(
                    &p.dir.join("server.crt"),
                    &p.dir.join("server.key"),
                    Mode::On,
                )
                .unwrap(),
            );
            use rustls::crypto::ring::cipher_suite as cs;
            for suite in [
                cs::TLS13_AES_128_GCM_SHA256,
                cs::TLS13_AES_256_GCM_SHA384,
                cs::TLS13_CHACHA20_POLY1305_SHA256,
            ] {
                let (mut cs, mut ss) = UnixStream::pair().unwrap();
                let ours = ours.clone();
                let server = std::thread::spawn(move || {
                    let (mut conn, secrets) = ours.connection().unwrap();
                    handshake(&mut conn, &mut ss).unwrap();
                    let b = crate::tls::binding(&conn).unwrap();
                    let mut s = Stream::new(ss, take_keys(conn, &secrets).unwrap());
                    s.sealer.set_rekey_after(OUR_REKEY);
                    let mut got = vec![0u8; N];
                    s.read_exact(&mut got).unwrap();
                    s.write_all(&got).unwrap();
                    s.close_notify().unwrap();
                    (b, got)
                });
                let conn = rustls::ClientConnection::new(plain_client(&p, suite), name()).unwrap();
                let mut c = rustls::StreamOwned::new(conn, &mut cs);
                let msg = super::data(N);
                for (i, piece) in msg.chunks(PIECE).enumerate() {
                    if i > 0 {
                        // rustls updates its keys and asks for ours (update_requested).
                        c.conn.refresh_traffic_keys().unwrap();
                    }
                    c.write_all(piece).unwrap();
                }
                let mut back = vec![0u8; N];
                c.read_exact(&mut back).unwrap();
                let mut rest = Vec::new();
                assert_eq!(
                    c.read_to_end(&mut rest).unwrap(),
                    0,
                    "close_notify: a clean end"
                );
                let (b, got) = server.join().unwrap();
                assert_eq!(c.conn.negotiated_cipher_suite(), Some(suite));
                assert!(got == msg && back == msg, "{suite:?}");
                let theirs = c
                    .conn
                    .export_keying_material(vec![0u8; 32], crate::tls::EXPORTER_LABEL, None)
                    .unwrap();
                assert_eq!(b, theirs, "the same channel binding on both ends");
            }
        }

        #[test]
        fn our_client_side_speaks_to_a_rustls_server_that_sends_tickets_and_updates_keys() {
            let p = pki("client");
            let ours = ClientTls::from_ca_file(&p.dir.join("server.crt"), Mode::On).unwrap();
            let (mut cs, mut ss) = UnixStream::pair().unwrap();
            let config = plain_server(&p);
            let server = std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut s = rustls::StreamOwned::new(conn, &mut ss);
                let left = echo(&mut s, N);
                let label = crate::tls::EXPORTER_LABEL;
                let b = s.conn.export_keying_material(vec![0u8; 32], label, None);
                (b.unwrap(), left)
            });
            let (mut conn, secrets) = ours.connection(name()).unwrap();
            handshake(&mut conn, &mut cs).unwrap();
            let b = crate::tls::binding(&conn).unwrap();
            let mut c = Stream::new(cs, take_keys(conn, &secrets).unwrap());
            c.sealer.set_rekey_after(OUR_REKEY);
            let msg = super::data(N);
            c.write_all(&msg).unwrap();
            let mut back = vec![0u8; N];
            c.read_exact(&mut back).unwrap();
            assert!(back == msg);
            c.close_notify().unwrap();
            let (theirs, left) = server.join().unwrap();
            assert_eq!(left, 0, "our close_notify read as the end");
            assert_eq!(b, theirs);
        }

        #[test]
        fn our_async_client_side_speaks_to_a_rustls_server_across_key_updates() {
            let p = pki("async");
            let ours = ClientTls::from_ca_file(&p.dir.join("server.crt"), Mode::On).unwrap();
            let config = plain_server(&p);
            let (cs, mut ss) = UnixStream::pair().unwrap();
            let server = std::thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut s = rustls::StreamOwned::new(conn, &mut ss);
                echo(&mut s, N)
            });
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                cs.set_nonblocking(true).unwrap();
                let mut cs = tokio::net::UnixStream::from_std(cs).unwrap();
                let (mut conn, secrets) = ours.connection(name()).unwrap();
                handshake_async(&mut conn, &mut cs).await.unwrap();
                let (opener, mut sealer) = take_keys(conn, &secrets).unwrap();
                sealer.set_rekey_after(OUR_REKEY);
                let (r, w) = cs.into_split();
                let (mut r, mut w) = (ReadHalf::new(r, opener), WriteHalf::new(w, sealer));
                let msg = super::data(N);
                let reading = async {
                    let mut back = vec![0u8; N];
                    r.read_exact(&mut back).await.unwrap();
                    back
                };
                let writing = async {
                    w.write_all(&msg).await.unwrap();
                    w.flush().await.unwrap();
                };
                let (back, ()) = tokio::join!(reading, writing);
                assert!(back == msg);
                w.shutdown().await.unwrap();
            });
            assert_eq!(
                server.join().unwrap(),
                0,
                "our close_notify read as the end"
            );
        }
    }
}
