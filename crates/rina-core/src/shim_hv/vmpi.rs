//! VMPI framing: the 4-byte channel id in front of every buffer and the
//! control messages of channel 0, as in IRATI's `shim-hv-core.c`
//! (`../shared/reference/irati.md` §2.6).
//!
//! ```text
//! buffer         [channel: u32][payload]
//! ALLOCATE_REQ   [0][channel: u32][source name, NUL][destination name, NUL][credit ext]?
//! ALLOCATE_RESP  [1][channel: u32][response: u8 (0 ok, 1 refused)][reason, UTF-8][NUL][credit ext]?
//! DEALLOCATE     [2][channel: u32]
//! CREDIT         [3][channel: u32][SDU limit: u64][byte limit: u64]
//! credit ext     ["FC"][window SDUs: u32][window bytes: u32]
//! ```
//!
//! Credit (see [`super::credit`]) is an extension: an end that supports it
//! appends the credit extension to its allocation request, and to its
//! (accepting) response only if the request had one, so an end that never
//! heard of it sees neither the extension (IRATI and earlier versions
//! ignore what follows the destination name, and the reason of an
//! acceptance) nor CREDIT messages. The extension says "I wait for your
//! credit on this channel, and here is the window I grant you"; a window of
//! zero SDUs or bytes grants no limit (the ends of N-1 flows of normal
//! IPCPs, whose frames are never held). A response without it, or a
//! request without it, makes the flow credit-less both ways, as before.
//! CREDIT carries cumulative limits for the channel's sender.
//!
//! IRATI writes integers in host order; this implementation fixes them to
//! little-endian (the host order of x86 and arm64 hosts, so the bytes are
//! the same there). The refusal reason after the response byte is an
//! addition IRATI does not send; an empty reason is IRATI's format. Names
//! are written as `apn/api/aen/aei` (empty trailing parts left out).

use super::credit::Window;
use rina_wire::AppName;
use thiserror::Error;

/// Bytes of the channel id in front of every buffer.
pub const CHANNEL_HEADER: usize = 4;
/// The control channel.
pub const CONTROL_CHANNEL: u32 = 0;
/// Channels per device, the control channel included.
pub const MAX_CHANNELS: u32 = 64;
/// Largest control message (as IRATI: a request is under 2000 bytes).
pub const MAX_CONTROL: usize = 2000;
/// Longest refusal reason sent, in bytes.
pub const MAX_REASON: usize = 512;

const CMD_ALLOCATE_REQ: u8 = 0;
const CMD_ALLOCATE_RESP: u8 = 1;
const CMD_DEALLOCATE: u8 = 2;
const CMD_CREDIT: u8 = 3;
/// What the credit extension starts with.
const CREDIT_EXT: &[u8; 2] = b"FC";
/// Bytes of the credit extension.
const CREDIT_EXT_LEN: usize = 10;
/// Bytes of a CREDIT message after its command and channel.
const CREDIT_LEN: usize = 16;

/// Why a buffer or control message could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VmpiError {
    /// Shorter than its fixed part.
    #[error("{what} is truncated ({len} bytes)")]
    Truncated { what: &'static str, len: usize },
    /// Longer than a control message may be.
    #[error("control message of {0} bytes (at most {MAX_CONTROL})")]
    TooLong(usize),
    /// An unknown command byte.
    #[error("unknown control command {0}")]
    UnknownCommand(u8),
    /// A channel number outside 1..64 where a data channel is expected.
    #[error("channel {0} is not a data channel (1..{MAX_CHANNELS})")]
    BadChannel(u32),
    /// A name without its NUL, not UTF-8, or not a valid application name.
    #[error("bad application name: {0}")]
    BadName(String),
    /// A response byte other than 0 or 1.
    #[error("unknown allocation response {0}")]
    BadResponse(u8),
}

/// A control message of channel 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Asks for a flow on `channel` from `src` to `dst`.
    /// `credit` is the window the requester grants (credit extension).
    AllocateReq {
        channel: u32,
        src: AppName,
        dst: AppName,
        credit: Option<Window>,
    },
    /// Answers an allocation request; `credit` as in the request (only
    /// with an acceptance).
    AllocateResp {
        channel: u32,
        ok: bool,
        reason: String,
        credit: Option<Window>,
    },
    /// The flow on `channel` is gone.
    Deallocate { channel: u32 },
    /// The sender of `channel` may send until its `sdus`-th SDU and
    /// `bytes`-th byte (cumulative, since the flow began).
    Credit { channel: u32, sdus: u64, bytes: u64 },
}

/// The credit extension at the start of `b`, if it is one.
fn credit_ext(b: &[u8]) -> Option<Window> {
    let e = b.get(..CREDIT_EXT_LEN)?;
    if &e[..2] != CREDIT_EXT {
        return None;
    }
    let u = |o: usize| u32::from_le_bytes([e[o], e[o + 1], e[o + 2], e[o + 3]]);
    Some(Window {
        sdus: u(2),
        bytes: u(6),
    })
}

fn push_credit_ext(v: &mut Vec<u8>, w: &Window) {
    v.extend_from_slice(CREDIT_EXT);
    v.extend_from_slice(&w.sdus.to_le_bytes());
    v.extend_from_slice(&w.bytes.to_le_bytes());
}

/// The channel id of `buf` and its payload.
pub fn split(buf: &[u8]) -> Result<(u32, &[u8]), VmpiError> {
    if buf.len() < CHANNEL_HEADER {
        return Err(VmpiError::Truncated {
            what: "a VMPI buffer",
            len: buf.len(),
        });
    }
    let ch = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    Ok((ch, &buf[CHANNEL_HEADER..]))
}

/// The header of a buffer of channel `ch`.
pub fn header(ch: u32) -> [u8; CHANNEL_HEADER] {
    ch.to_le_bytes()
}

fn data_channel(ch: u32) -> Result<u32, VmpiError> {
    if ch == CONTROL_CHANNEL || ch >= MAX_CHANNELS {
        Err(VmpiError::BadChannel(ch))
    } else {
        Ok(ch)
    }
}

fn name(b: &[u8]) -> Result<AppName, VmpiError> {
    let s = std::str::from_utf8(b).map_err(|e| VmpiError::BadName(e.to_string()))?;
    s.parse()
        .map_err(|e: rina_wire::NameError| VmpiError::BadName(format!("{s:?}: {e}")))
}

impl Control {
    /// Parses the payload of a channel-0 buffer.
    pub fn parse(p: &[u8]) -> Result<Control, VmpiError> {
        if p.len() > MAX_CONTROL {
            return Err(VmpiError::TooLong(p.len()));
        }
        if p.len() < 5 {
            return Err(VmpiError::Truncated {
                what: "a control message",
                len: p.len(),
            });
        }
        let ch = data_channel(u32::from_le_bytes([p[1], p[2], p[3], p[4]]))?;
        let rest = &p[5..];
        match p[0] {
            CMD_ALLOCATE_REQ => {
                let mut parts = rest.splitn(3, |&b| b == 0);
                let (Some(src), Some(dst), Some(ext)) = (parts.next(), parts.next(), parts.next())
                else {
                    return Err(VmpiError::BadName("names are not NUL-terminated".into()));
                };
                Ok(Control::AllocateReq {
                    channel: ch,
                    src: name(src)?,
                    dst: name(dst)?,
                    credit: credit_ext(ext),
                })
            }
            CMD_ALLOCATE_RESP => {
                let (&r, reason) = rest.split_first().ok_or(VmpiError::Truncated {
                    what: "an allocation response",
                    len: p.len(),
                })?;
                let ok = match r {
                    0 => true,
                    1 => false,
                    other => return Err(VmpiError::BadResponse(other)),
                };
                let (reason, credit) = match reason.iter().position(|&b| b == 0) {
                    Some(k) => (&reason[..k], credit_ext(&reason[k + 1..])),
                    None => (reason, None),
                };
                Ok(Control::AllocateResp {
                    channel: ch,
                    ok,
                    reason: String::from_utf8_lossy(&reason[..reason.len().min(MAX_REASON)])
                        .into_owned(),
                    credit: credit.filter(|_| ok),
                })
            }
            CMD_DEALLOCATE => Ok(Control::Deallocate { channel: ch }),
            CMD_CREDIT => {
                let b = rest.get(..CREDIT_LEN).ok_or(VmpiError::Truncated {
                    what: "a credit message",
                    len: p.len(),
                })?;
                let u = |o: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&b[o..o + 8]);
                    u64::from_le_bytes(w)
                };
                Ok(Control::Credit {
                    channel: ch,
                    sdus: u(0),
                    bytes: u(8),
                })
            }
            other => Err(VmpiError::UnknownCommand(other)),
        }
    }

    /// The whole buffer: channel 0 header and the message.
    pub fn to_buffer(&self) -> Vec<u8> {
        let mut v = header(CONTROL_CHANNEL).to_vec();
        match self {
            Control::AllocateReq {
                channel,
                src,
                dst,
                credit,
            } => {
                v.push(CMD_ALLOCATE_REQ);
                v.extend_from_slice(&channel.to_le_bytes());
                v.extend_from_slice(src.to_string().as_bytes());
                v.push(0);
                v.extend_from_slice(dst.to_string().as_bytes());
                v.push(0);
                if let Some(w) = credit {
                    push_credit_ext(&mut v, w);
                }
            }
            Control::AllocateResp {
                channel,
                ok,
                reason,
                credit,
            } => {
                v.push(CMD_ALLOCATE_RESP);
                v.extend_from_slice(&channel.to_le_bytes());
                v.push(if *ok { 0 } else { 1 });
                let r = rina_wire::codec::truncate_utf8(reason, MAX_REASON);
                // A reason ends at its first NUL (where the extension starts).
                let r = r.split('\0').next().unwrap_or_default();
                v.extend_from_slice(r.as_bytes());
                if let Some(w) = credit.filter(|_| *ok) {
                    v.push(0);
                    push_credit_ext(&mut v, &w);
                }
            }
            Control::Deallocate { channel } => {
                v.push(CMD_DEALLOCATE);
                v.extend_from_slice(&channel.to_le_bytes());
            }
            Control::Credit {
                channel,
                sdus,
                bytes,
            } => {
                v.push(CMD_CREDIT);
                v.extend_from_slice(&channel.to_le_bytes());
                v.extend_from_slice(&sdus.to_le_bytes());
                v.extend_from_slice(&bytes.to_le_bytes());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_messages_round_trip_with_irati_bytes() {
        let req = Control::AllocateReq {
            channel: 3,
            src: "a/1".parse().unwrap(),
            dst: "b".parse().unwrap(),
            credit: None,
        };
        let b = req.to_buffer();
        assert_eq!(b, [0, 0, 0, 0, 0, 3, 0, 0, 0, b'a', b'/', b'1', 0, b'b', 0]);
        let (ch, p) = split(&b).unwrap();
        assert_eq!(ch, 0);
        assert_eq!(Control::parse(p).unwrap(), req);
        let resp = Control::AllocateResp {
            channel: 63,
            ok: false,
            reason: "busy".into(),
            credit: None,
        };
        assert_eq!(Control::parse(&resp.to_buffer()[4..]).unwrap(), resp);
        // IRATI's response has no reason.
        assert_eq!(
            Control::parse(&[1, 5, 0, 0, 0, 0]).unwrap(),
            Control::AllocateResp {
                channel: 5,
                ok: true,
                reason: String::new(),
                credit: None,
            }
        );
        let d = Control::Deallocate { channel: 9 };
        assert_eq!(Control::parse(&d.to_buffer()[4..]).unwrap(), d);
    }

    #[test]
    fn credit_extension_and_message_round_trip_and_old_parsers_skip_them() {
        let w = Window {
            sdus: 256,
            bytes: 1 << 20,
        };
        let req = Control::AllocateReq {
            channel: 3,
            src: "a".parse().unwrap(),
            dst: "b".parse().unwrap(),
            credit: Some(w),
        };
        let b = req.to_buffer();
        assert_eq!(&b[9..15], &[b'a', 0, b'b', 0, b'F', b'C']);
        assert_eq!(Control::parse(&b[4..]).unwrap(), req);
        let resp = Control::AllocateResp {
            channel: 3,
            ok: true,
            reason: String::new(),
            credit: Some(Window { sdus: 0, bytes: 0 }),
        };
        let b = resp.to_buffer();
        // Response byte 0, an empty reason, NUL, the extension.
        assert_eq!(&b[9..13], &[0, 0, b'F', b'C']);
        assert_eq!(Control::parse(&b[4..]).unwrap(), resp);
        // A refusal carries no extension; a reason with NULs is cut there.
        let no = Control::AllocateResp {
            channel: 3,
            ok: false,
            reason: "no\0FC".into(),
            credit: Some(w),
        };
        assert_eq!(
            Control::parse(&no.to_buffer()[4..]).unwrap(),
            Control::AllocateResp {
                channel: 3,
                ok: false,
                reason: "no".into(),
                credit: None
            }
        );
        // Garbage after the names is no extension.
        assert!(matches!(
            Control::parse(&[0, 1, 0, 0, 0, b'a', 0, b'b', 0, b'x', b'y']),
            Ok(Control::AllocateReq { credit: None, .. })
        ));
        let c = Control::Credit {
            channel: 63,
            sdus: u64::MAX,
            bytes: 7,
        };
        let b = c.to_buffer();
        assert_eq!(b.len(), 4 + 21);
        assert_eq!(Control::parse(&b[4..]).unwrap(), c);
        for k in 5..21 {
            assert!(
                matches!(
                    Control::parse(&b[4..4 + k]),
                    Err(VmpiError::Truncated { .. })
                ),
                "{k} bytes"
            );
        }
    }

    #[test]
    fn bad_control_messages_are_errors() {
        assert!(matches!(
            Control::parse(&[2, 0, 0, 0]),
            Err(VmpiError::Truncated { .. })
        ));
        assert_eq!(
            Control::parse(&[2, 0, 0, 0, 0]),
            Err(VmpiError::BadChannel(0))
        );
        assert_eq!(
            Control::parse(&[2, 64, 0, 0, 0]),
            Err(VmpiError::BadChannel(64))
        );
        assert_eq!(
            Control::parse(&[9, 1, 0, 0, 0]),
            Err(VmpiError::UnknownCommand(9))
        );
        assert_eq!(
            Control::parse(&[1, 1, 0, 0, 0, 7]),
            Err(VmpiError::BadResponse(7))
        );
        assert!(matches!(
            Control::parse(&[0, 1, 0, 0, 0, b'a', 0, b'b']),
            Err(VmpiError::BadName(_))
        ));
        assert!(matches!(
            Control::parse(&[0, 1, 0, 0, 0, 0, b'b', 0]),
            Err(VmpiError::BadName(_))
        ));
        assert!(matches!(split(&[1, 2]), Err(VmpiError::Truncated { .. })));
    }

    proptest! {
        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Control::parse(&b);
            let _ = split(&b);
        }
    }
}
