//! Capabilities: what a client of the servers may touch, signed with the cluster key.
//!
//! A token is `SRG1 | claims | HMAC-SHA256(key, SRG1 | claims)`; the claims name the instance
//! (or every instance, for the manager and administrators), optionally one namespace of it, the
//! user the client acts for (whose uid every create must carry), and an expiry. The manager
//! issues them to the users it authenticated with MUNGE; anyone who can read the cluster key
//! (root, the service user) can make one by hand. Servers check the signature and the expiry
//! when a connection presents one, and the scope on every request.

use crate::key::Key;
use crate::{AuthError, Caller};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

const MAGIC: &[u8; 4] = b"SRG1";
const MAC_LEN: usize = 32;

/// What a capability allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rights {
    /// Data and metadata of the instance (and namespace) named.
    Instance,
    /// Everything on the servers: creating and destroying fragments and namespaces, every
    /// instance's data, status (the manager and administrators).
    Admin,
    /// Reading the manager's HTTP API as the caller (their own sessions, instances and stage
    /// tasks; everything for administrators). Servers refuse it.
    View,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The instance (ignored for [`Rights::Admin`]).
    pub instance: u64,
    /// One namespace of it, or all of them.
    pub ns: Option<u32>,
    /// Who the client acts for.
    pub caller: Caller,
    pub rights: Rights,
    /// Unix seconds after which the token is refused.
    pub expires: i64,
    /// The generation of the instance it was issued for (`InstanceDescriptor::generation`, a
    /// random number drawn when the instance was made): servers refuse it once they hold no
    /// instance of that generation, so destroying an instance revokes its capabilities at
    /// once, and an instance made later with the same id is not covered. 0: not bound to one
    /// (made by hand with the cluster key; admin capabilities).
    pub generation: u64,
}

impl Claims {
    /// True when these claims allow requests about `instance` (and namespace `ns`, when the
    /// request names one).
    pub fn covers(&self, instance: u64, ns: Option<u32>) -> bool {
        match self.rights {
            Rights::Admin => true,
            Rights::View => false,
            Rights::Instance => {
                self.instance == instance
                    && match (self.ns, ns) {
                        (Some(mine), Some(asked)) => mine == asked,
                        _ => true,
                    }
            }
        }
    }
}

/// A new instance generation (`Claims::generation`): random, never 0.
pub fn new_generation() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No randomness: the time still differs from any earlier instance's.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        b = t.to_le_bytes();
    }
    u64::from_le_bytes(b).max(1)
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({} bytes)", self.0.len())
    }
}

fn mac(key: &Key) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    <Hmac<Sha256> as Mac>::new_from_slice(key.bytes()).unwrap_or_else(|_| unreachable!())
}

/// The label of a presentation's proof (the binding follows it).
const PROOF_LABEL: &[u8] = b"surge capability proof v1|";

/// `HMAC(signature, label | binding)`, ready to finalize or verify.
fn proof(sig: &[u8], binding: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(sig).unwrap_or_else(|_| unreachable!());
    m.update(PROOF_LABEL);
    m.update(binding);
    m
}

impl Token {
    /// Signs `claims` with `key`.
    pub fn mint(key: &Key, claims: &Claims) -> Token {
        let mut out = MAGIC.to_vec();
        // Serializing plain data into a Vec cannot fail.
        out.extend(postcard::to_allocvec(claims).unwrap_or_default());
        let mut m = mac(key);
        m.update(&out);
        out.extend(m.finalize().into_bytes());
        Token(out)
    }

    /// A capability for the manager and administrators, valid `secs` seconds.
    pub fn admin(key: &Key, caller: Caller, secs: i64) -> Token {
        Token::mint(
            key,
            &Claims {
                instance: 0,
                ns: None,
                caller,
                rights: Rights::Admin,
                expires: now() + secs,
                generation: 0,
            },
        )
    }

    /// The claims, if `key` signed them and they have not expired at `at`.
    pub fn verify(&self, key: &Key, at: i64) -> Result<Claims, AuthError> {
        let b = &self.0;
        if b.len() < MAGIC.len() + MAC_LEN || &b[..MAGIC.len()] != MAGIC {
            return Err(AuthError::Token("not a Surge capability".into()));
        }
        let (body, sig) = b.split_at(b.len() - MAC_LEN);
        let mut m = mac(key);
        m.update(body);
        m.verify_slice(sig).map_err(|_| {
            AuthError::Token("bad signature (not made with this cluster's key)".into())
        })?;
        let claims: Claims = postcard::from_bytes(&body[MAGIC.len()..])
            .map_err(|e| AuthError::Token(format!("malformed claims: {e}")))?;
        if claims.expires < at {
            return Err(AuthError::Token(format!(
                "expired {} s ago",
                at - claims.expires
            )));
        }
        Ok(claims)
    }

    /// What a client sends in `Authenticate` on a connection whose channel binding is
    /// `binding` (the TLS exporter of RFC 9266, empty on a clear channel): the token's claims
    /// and a proof made with its signature, `HMAC(signature, label | binding)`, instead of the
    /// signature itself. The signature never crosses the wire, so a captured presentation
    /// cannot be turned into a token, and it proves nothing on another TLS connection.
    pub fn present(&self, binding: &[u8]) -> Vec<u8> {
        let b = &self.0;
        if b.len() < MAGIC.len() + MAC_LEN {
            // Not a token: sent as is, and refused by the server.
            return b.clone();
        }
        let (body, sig) = b.split_at(b.len() - MAC_LEN);
        let mut out = body.to_vec();
        out.extend(proof(sig, binding).finalize().into_bytes());
        out
    }

    /// The claims of a presentation ([`present`](Self::present)) received on a channel whose
    /// binding is `binding`, if `key` signed them, the proof was made for this channel, and
    /// they have not expired at `at`.
    pub fn verify_presented(
        key: &Key,
        presented: &[u8],
        binding: &[u8],
        at: i64,
    ) -> Result<Claims, AuthError> {
        if presented.len() < MAGIC.len() + MAC_LEN || &presented[..MAGIC.len()] != MAGIC {
            return Err(AuthError::Token("not a Surge capability".into()));
        }
        let (body, got) = presented.split_at(presented.len() - MAC_LEN);
        let mut m = mac(key);
        m.update(body);
        let sig = m.finalize().into_bytes();
        proof(&sig, binding).verify_slice(got).map_err(|_| {
            AuthError::Token(
                "bad proof: not signed with this cluster's key, or presented on another \
                 connection than the one it was made for"
                    .into(),
            )
        })?;
        let mut whole = body.to_vec();
        whole.extend(sig);
        Token(whole).verify(key, at)
    }

    /// The claims as written, without checking the signature or the expiry (`None` if they do
    /// not parse). Only for lowering one's own rights (a root mount opening the job's PFS
    /// files as the user its capability acts for, never as root): a forged token can make
    /// its holder act as someone other than root, and every server still refuses it.
    pub fn claims_unchecked(&self) -> Option<Claims> {
        let b = &self.0;
        if b.len() < MAGIC.len() + MAC_LEN || &b[..MAGIC.len()] != MAGIC {
            return None;
        }
        postcard::from_bytes(&b[MAGIC.len()..b.len() - MAC_LEN]).ok()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn from_bytes(b: Vec<u8>) -> Token {
        Token(b)
    }

    /// The token as text (hex), for environment variables and files.
    pub fn to_text(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_text(s: &str) -> Result<Token, AuthError> {
        let s = s.trim();
        if !s.len().is_multiple_of(2) {
            return Err(AuthError::Token("odd number of hex digits".into()));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map(Token)
            .map_err(|e| AuthError::Token(format!("not hex: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(expires: i64) -> Claims {
        Claims {
            instance: 42,
            ns: Some(1),
            caller: Caller {
                uid: 1001,
                gid: 1001,
                groups: vec![1001, 27],
            },
            rights: Rights::Instance,
            expires,
            generation: 7,
        }
    }

    #[test]
    fn a_token_verifies_with_its_key_only_and_until_it_expires() {
        let k = Key::generate().unwrap();
        let t = Token::mint(&k, &claims(now() + 60));
        assert_eq!(
            t.verify(&k, now()).unwrap(),
            claims(t.verify(&k, now()).unwrap().expires)
        );
        let other = Key::generate().unwrap();
        assert!(t.verify(&other, now()).is_err(), "another cluster's key");
        assert!(t.verify(&k, now() + 120).is_err(), "expired");
        let back = Token::from_text(&t.to_text()).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn a_changed_claim_breaks_the_signature() {
        let k = Key::generate().unwrap();
        let mut b = Token::mint(&k, &claims(now() + 60)).bytes().to_vec();
        // Flip a bit of the claims (the uid lives there): refused.
        b[6] ^= 1;
        assert!(Token::from_bytes(b).verify(&k, now()).is_err());
        assert!(Token::from_bytes(b"SRG1".to_vec())
            .verify(&k, now())
            .is_err());
    }

    #[test]
    fn a_presentation_proves_the_token_on_its_own_channel_only() {
        let k = Key::generate().unwrap();
        let t = Token::mint(&k, &claims(now() + 60));
        let on_a = t.present(b"channel A");
        assert!(
            !on_a
                .windows(MAC_LEN)
                .any(|w| w == &t.bytes()[t.bytes().len() - MAC_LEN..]),
            "the signature itself is never sent"
        );
        assert_eq!(
            Token::verify_presented(&k, &on_a, b"channel A", now())
                .unwrap()
                .instance,
            42
        );
        assert!(Token::verify_presented(&k, &on_a, b"channel B", now()).is_err());
        assert!(Token::verify_presented(&k, t.bytes(), b"channel A", now()).is_err());
        let other = Key::generate().unwrap();
        assert!(Token::verify_presented(&other, &on_a, b"channel A", now()).is_err());
        let late = t.present(b"");
        assert!(Token::verify_presented(&k, &late, b"", now() + 120).is_err());
    }

    #[test]
    fn scope_is_one_instance_and_namespace_unless_admin() {
        let c = claims(0);
        assert!(c.covers(42, Some(1)));
        assert!(c.covers(42, None), "fragment requests name no namespace");
        assert!(!c.covers(42, Some(0)));
        assert!(!c.covers(43, Some(1)));
        let a = Claims {
            rights: Rights::Admin,
            ..c
        };
        assert!(a.covers(7, Some(3)));
    }
}
