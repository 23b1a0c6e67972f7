//! Session ids. An id is 32 bytes (256 bits) from the operating system's CSPRNG (`getrandom`), written
//! as 43 characters of unpadded URL-safe base64. Only its SHA-256 hash is ever stored; the id itself
//! exists in the reply to the orchestrator, in the session URL and in the user's cookie.

use sha2::{Digest, Sha256};

/// Random bytes in an id.
pub const BYTES: usize = 32;
/// Characters of an id: `ceil(32 * 8 / 6)`.
pub const LEN: usize = 43;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The operating system could not give random bytes: no session can be opened safely.
#[derive(Debug, thiserror::Error)]
#[error(
    "the operating system's random number generator failed ({0}); no session id can be made: check the \
     host's /dev/urandom or getrandom(2)"
)]
pub struct RandomError(String);

/// A new session id. Never log it: log [`Hash::short`] of its hash if anything.
pub fn generate() -> Result<String, RandomError> {
    let mut bytes = [0u8; BYTES];
    getrandom::fill(&mut bytes).map_err(|e| RandomError(e.to_string()))?;
    Ok(encode(&bytes))
}

/// Unpadded URL-safe base64.
fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// Whether `s` has the shape of an id (43 URL-safe base64 characters). Anything else is refused before
/// it is hashed or looked up.
pub fn well_formed(s: &str) -> bool {
    s.len() == LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The SHA-256 of an id: what is stored and compared.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash(pub [u8; 32]);

impl std::fmt::Debug for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hash({})", self.short())
    }
}

impl Hash {
    /// The hash of an id.
    pub fn of(id: &str) -> Hash {
        Hash(Sha256::digest(id.as_bytes()).into())
    }

    /// 64 lower-case hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// From [`Hash::hex`].
    pub fn from_hex(s: &str) -> Option<Hash> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Hash(out))
    }

    /// The first 12 hex digits, to tell sessions apart in logs (it says nothing about the id).
    pub fn short(&self) -> String {
        self.hex()[..12].to_owned()
    }

    /// Compares in constant time: every byte is looked at whatever the first difference.
    pub fn constant_time_eq(&self, other: &Hash) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            diff |= std::hint::black_box(a ^ b);
        }
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_url_safe_distinct_and_hash_to_hex() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a, b);
        assert!(well_formed(&a), "{a}");
        assert_eq!(a.len(), LEN);
        assert!(!well_formed(&a[1..]));
        assert!(!well_formed(&format!("{}=", &a[1..])));
        let h = Hash::of(&a);
        assert_eq!(Hash::from_hex(&h.hex()), Some(h));
        assert!(h.constant_time_eq(&Hash::of(&a)));
        assert!(!h.constant_time_eq(&Hash::of(&b)));
        assert_eq!(Hash::from_hex("zz"), None);
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        // RFC 4648 §10, unpadded.
        assert_eq!(encode(b"f"), "Zg");
        assert_eq!(encode(b"fo"), "Zm8");
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode(&[0xfb, 0xff]), "-_8");
    }
}
