//! Authentication policies of enrollment: mutual challenge–response that
//! never puts a secret on the wire, and the injected source of nonces.
//!
//! Every policy runs in the same three messages (see the module table of
//! [`super`]):
//!
//! | # | message | enrollee → member / member → enrollee |
//! |---|---|---|
//! | 1 | M_CONNECT, auth options | [`AuthPolicy::hello`]: the enrollee's nonce `Ne` (and, with keys, its public key) |
//! | 2 | M_CONNECT_R, auth options | [`AuthPolicy::challenge`]: the member's nonce `Nm` and its proof over `Ne, Nm` |
//! | 3 | M_START `/difm/enr`, `token` | [`AuthPolicy::respond`]: the enrollee's proof over `Ne, Nm` (hex) |
//!
//! The member checks message 3 with [`AuthPolicy::verify`] before it gives
//! an address; the enrollee checks message 2 before it sends message 3, so
//! both sides prove themselves, each over a nonce the other chose. Proofs
//! carry distinct labels for each direction and each [`Handshake`]
//! (enrollment, or port authentication between members), so a member's
//! proof can never stand for an enrollee's, nor a proof of one handshake
//! for one of the other.
//!
//! * [`AuthPassword`] (`password` in `rinad`): HMAC-SHA256 keyed by the
//!   pre-shared password. The password never crosses the wire; a passive
//!   observer of one enrollment can still try to guess a weak password
//!   offline against the MACs, so choose a long one.
//! * [`AuthKeys`] (`key` / `trusted_keys` in `rinad`): every member holds
//!   an ed25519 key pair and the DIF trusts a list of public keys; each side
//!   signs the transcript and checks the other's key is trusted.
//!
//! Nonces come from a [`NonceGen`] seeded by the driver (the operating
//! system's random source in `rinad`, a fixed seed in tests and the
//! simulator): the core reads no randomness itself.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use thiserror::Error;

/// A nonce of one side of an authentication.
pub type Nonce = [u8; 32];

/// Name of the HMAC-SHA256 password challenge–response policy.
pub const AUTH_PASSWORD: &str = "rina-auth-hmac-sha256";
/// Name of the ed25519 key policy.
pub const AUTH_KEYS: &str = "rina-auth-ed25519";

/// Which handshake a proof belongs to. Each has its own labels, one for
/// each direction, so a proof made in one can never be taken in the other
/// (a member's answer to an enrollment hello is no answer to a port
/// authentication, and an initiator's port proof no enrollment token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// Enrollment: the enrollee says hello, the member answers.
    Enrollment,
    /// Port authentication between two members
    /// ([`crate::normal::membership`]): the initiator says hello, the
    /// answerer answers.
    Port,
}

impl Handshake {
    /// The label of the answering side's proof (member, answerer).
    fn answer_label(self) -> &'static [u8] {
        match self {
            Handshake::Enrollment => b"rina enrollment: member proof",
            Handshake::Port => b"rina port authentication: answerer proof",
        }
    }

    /// The label of the side that said hello (enrollee, initiator).
    fn hello_label(self) -> &'static [u8] {
        match self {
            Handshake::Enrollment => b"rina enrollment: enrollee proof",
            Handshake::Port => b"rina port authentication: initiator proof",
        }
    }
}
const LABEL_NONCE: &[u8] = b"rina nonce";
const LABEL_CHILD: &[u8] = b"rina nonce child";

/// Why an authentication step failed. The text is safe to show and log: it
/// never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AuthFailure {
    /// The peer's authentication data has the wrong length or layout.
    #[error("malformed authentication data: {0}")]
    Malformed(&'static str),
    /// The peer's proof does not verify: it does not know the password, or
    /// does not hold the private key of the public key it showed.
    #[error("the peer's proof does not verify (wrong password or key)")]
    BadProof,
    /// The peer's public key is not among the DIF's trusted keys.
    #[error("public key {0} is not trusted by this DIF")]
    UntrustedKey(String),
    /// The enrollee found the member's proof wrong and said so with an
    /// empty proof (so the member learns why the enrollment ended).
    #[error("the enrollee rejected this member's proof (the passwords or keys differ)")]
    RejectedByPeer,
}

/// Authentication policy of enrollment (a per-DIF choice). See the module
/// documentation for the messages.
pub trait AuthPolicy: Send {
    /// Policy name carried in M_CONNECT; both sides must use the same one.
    fn name(&self) -> &str;
    /// Enrollee, message 1: the M_CONNECT auth options, given its nonce.
    fn hello(&self, nonce: &Nonce) -> Vec<u8>;
    /// Member, message 2 of handshake `hs`: checks the hello and returns
    /// the M_CONNECT_R auth options (with its proof) and the context
    /// [`AuthPolicy::verify`] needs later.
    fn challenge(
        &self,
        hs: Handshake,
        hello: &[u8],
        nonce: &Nonce,
    ) -> Result<(Vec<u8>, Vec<u8>), AuthFailure>;
    /// Enrollee: checks the member's answer to `nonce` (its own) in
    /// handshake `hs` and returns its proof, message 3.
    fn respond(&self, hs: Handshake, nonce: &Nonce, answer: &[u8]) -> Result<Vec<u8>, AuthFailure>;
    /// Member: checks the enrollee's proof in handshake `hs` against the
    /// context of [`AuthPolicy::challenge`].
    fn verify(&self, hs: Handshake, context: &[u8], proof: &[u8]) -> Result<(), AuthFailure>;
}

/// No authentication: nothing is sent or checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthNone;

impl AuthPolicy for AuthNone {
    fn name(&self) -> &str {
        rina_wire::cdap::AUTH_NONE
    }
    fn hello(&self, _nonce: &Nonce) -> Vec<u8> {
        Vec::new()
    }
    fn challenge(
        &self,
        _hs: Handshake,
        _hello: &[u8],
        _nonce: &Nonce,
    ) -> Result<(Vec<u8>, Vec<u8>), AuthFailure> {
        Ok((Vec::new(), Vec::new()))
    }
    fn respond(
        &self,
        _hs: Handshake,
        _nonce: &Nonce,
        _answer: &[u8],
    ) -> Result<Vec<u8>, AuthFailure> {
        Ok(Vec::new())
    }
    fn verify(&self, _hs: Handshake, _context: &[u8], _proof: &[u8]) -> Result<(), AuthFailure> {
        Ok(())
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn split32<'a>(b: &'a [u8], what: &'static str) -> Result<(Nonce, &'a [u8]), AuthFailure> {
    if b.len() < 32 {
        return Err(AuthFailure::Malformed(what));
    }
    let (n, rest) = b.split_at(32);
    Ok((
        n.try_into().map_err(|_| AuthFailure::Malformed(what))?,
        rest,
    ))
}

/// A pre-shared password, proven by HMAC-SHA256 over both nonces (it never
/// crosses the wire). Its `Debug` hides it.
#[derive(Clone)]
pub struct AuthPassword(pub String);

impl fmt::Debug for AuthPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthPassword(<hidden>)")
    }
}

impl AuthPassword {
    fn mac(&self, label: &[u8], ne: &Nonce, nm: &Nonce) -> [u8; 32] {
        hmac(self.0.as_bytes(), &[label, ne, nm])
    }
}

impl AuthPolicy for AuthPassword {
    fn name(&self) -> &str {
        AUTH_PASSWORD
    }
    fn hello(&self, nonce: &Nonce) -> Vec<u8> {
        nonce.to_vec()
    }
    fn challenge(
        &self,
        hs: Handshake,
        hello: &[u8],
        nonce: &Nonce,
    ) -> Result<(Vec<u8>, Vec<u8>), AuthFailure> {
        let (ne, rest) = split32(hello, "hello is not a 32-byte nonce")?;
        if !rest.is_empty() {
            return Err(AuthFailure::Malformed("hello is not a 32-byte nonce"));
        }
        let mut answer = nonce.to_vec();
        answer.extend_from_slice(&self.mac(hs.answer_label(), &ne, nonce));
        let mut ctx = ne.to_vec();
        ctx.extend_from_slice(nonce);
        Ok((answer, ctx))
    }
    fn respond(&self, hs: Handshake, nonce: &Nonce, answer: &[u8]) -> Result<Vec<u8>, AuthFailure> {
        let (nm, mac) = split32(answer, "answer is not a nonce and a MAC")?;
        if mac.len() != 32 {
            return Err(AuthFailure::Malformed("answer is not a nonce and a MAC"));
        }
        if !super::constant_time_eq(&self.mac(hs.answer_label(), nonce, &nm), mac) {
            return Err(AuthFailure::BadProof);
        }
        Ok(self.mac(hs.hello_label(), nonce, &nm).to_vec())
    }
    fn verify(&self, hs: Handshake, context: &[u8], proof: &[u8]) -> Result<(), AuthFailure> {
        let (ne, nm) = split32(context, "context")?;
        let (nm, _) = split32(nm, "context")?;
        if super::constant_time_eq(&self.mac(hs.hello_label(), &ne, &nm), proof) {
            Ok(())
        } else {
            Err(AuthFailure::BadProof)
        }
    }
}

/// An ed25519 key pair of this member and the DIF's trusted public keys.
/// Each side signs `label ‖ Ne ‖ Nm ‖ the other's public key`. Its `Debug`
/// shows only the public key.
#[derive(Clone)]
pub struct AuthKeys {
    key: ed25519_dalek::SigningKey,
    trusted: Vec<[u8; 32]>,
}

impl fmt::Debug for AuthKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthKeys(public {})", hex(&self.public_key()))
    }
}

impl AuthKeys {
    /// This member's key pair from its 32-byte secret seed, and the public
    /// keys the DIF trusts (its own need not be listed).
    pub fn new(secret: [u8; 32], trusted: Vec<[u8; 32]>) -> Self {
        AuthKeys {
            key: ed25519_dalek::SigningKey::from_bytes(&secret),
            trusted,
        }
    }

    /// This member's public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    fn sign(&self, label: &[u8], ne: &Nonce, nm: &Nonce, peer: &[u8; 32]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        let msg = [label, ne, nm, peer].concat();
        self.key.sign(&msg).to_bytes()
    }

    /// Checks that `peer` is trusted and signed `label ‖ ne ‖ nm ‖ us`.
    fn check(
        &self,
        peer: &[u8],
        sig: &[u8],
        label: &[u8],
        ne: &Nonce,
        nm: &Nonce,
    ) -> Result<[u8; 32], AuthFailure> {
        let pk: [u8; 32] = peer
            .try_into()
            .map_err(|_| AuthFailure::Malformed("public key is not 32 bytes"))?;
        if !self.trusted.contains(&pk) {
            return Err(AuthFailure::UntrustedKey(hex(&pk)));
        }
        let sig: [u8; 64] = sig
            .try_into()
            .map_err(|_| AuthFailure::Malformed("signature is not 64 bytes"))?;
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).map_err(|_| AuthFailure::BadProof)?;
        let msg = [label, ne, nm, &self.public_key()].concat();
        vk.verify_strict(&msg, &ed25519_dalek::Signature::from_bytes(&sig))
            .map_err(|_| AuthFailure::BadProof)?;
        Ok(pk)
    }
}

impl AuthPolicy for AuthKeys {
    fn name(&self) -> &str {
        AUTH_KEYS
    }
    fn hello(&self, nonce: &Nonce) -> Vec<u8> {
        [&nonce[..], &self.public_key()].concat()
    }
    fn challenge(
        &self,
        hs: Handshake,
        hello: &[u8],
        nonce: &Nonce,
    ) -> Result<(Vec<u8>, Vec<u8>), AuthFailure> {
        let (ne, pk) = split32(hello, "hello is not a nonce and a public key")?;
        let pk: [u8; 32] = pk
            .try_into()
            .map_err(|_| AuthFailure::Malformed("hello is not a nonce and a public key"))?;
        if !self.trusted.contains(&pk) {
            return Err(AuthFailure::UntrustedKey(hex(&pk)));
        }
        let sig = self.sign(hs.answer_label(), &ne, nonce, &pk);
        let answer = [&nonce[..], &self.public_key(), &sig].concat();
        let ctx = [&ne[..], nonce, &pk].concat();
        Ok((answer, ctx))
    }
    fn respond(&self, hs: Handshake, nonce: &Nonce, answer: &[u8]) -> Result<Vec<u8>, AuthFailure> {
        if answer.len() != 32 + 32 + 64 {
            return Err(AuthFailure::Malformed(
                "answer is not a nonce, a public key and a signature",
            ));
        }
        let (nm, rest) = split32(answer, "answer")?;
        let (pk, sig) = rest.split_at(32);
        let member = self.check(pk, sig, hs.answer_label(), nonce, &nm)?;
        Ok(self.sign(hs.hello_label(), nonce, &nm, &member).to_vec())
    }
    fn verify(&self, hs: Handshake, context: &[u8], proof: &[u8]) -> Result<(), AuthFailure> {
        if context.len() != 96 {
            return Err(AuthFailure::Malformed("context"));
        }
        let (ne, rest) = split32(context, "context")?;
        let (nm, pk) = split32(rest, "context")?;
        self.check(pk, proof, hs.hello_label(), &ne, &nm)
            .map(|_| ())
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses lower- or upper-case hex; `None` if it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A deterministic source of nonces from a seed the driver injects: nonce
/// *i* is HMAC-SHA256(seed, "rina nonce" ‖ i). Unpredictable exactly as long
/// as the seed is; `rinad` seeds it from the operating system.
#[derive(Clone)]
pub struct NonceGen {
    seed: [u8; 32],
    counter: u64,
}

impl fmt::Debug for NonceGen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NonceGen(<seeded>)")
    }
}

impl NonceGen {
    /// A generator from `seed`.
    pub fn new(seed: [u8; 32]) -> Self {
        NonceGen { seed, counter: 0 }
    }

    /// The next nonce.
    pub fn next_nonce(&mut self) -> Nonce {
        self.counter += 1;
        hmac(&self.seed, &[LABEL_NONCE, &self.counter.to_be_bytes()])
    }

    /// An independent generator (for another machine), never yielding the
    /// nonces of this one or of another child.
    pub fn child(&mut self) -> NonceGen {
        self.counter += 1;
        NonceGen::new(hmac(
            &self.seed,
            &[LABEL_CHILD, &self.counter.to_be_bytes()],
        ))
    }
}
