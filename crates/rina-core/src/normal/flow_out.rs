//! A flow's way out and in between EFCP and the RMT: the flush of one
//! flow (its deliveries to the driver, then its PDUs, written in place and
//! handed to the RMT), and the short ways of a flow without DTCP policies,
//! which skip EFCP's queues when nothing waits in them: a fragment written
//! goes to the RMT at once ([`Out::send_or_queue`]), and the next PDU in
//! order is delivered on arrival (`NormalIpcp::on_data` with
//! [`Flow::deliver`]).
//!
//! The short ways matter most for the N-1 flows an IPCP of the DIF above
//! rides on: every PDU of that DIF is an SDU of such a flow, so the work
//! saved here is saved once per PDU per layer. What comes out is what the
//! queues would have given: the same sequence numbers and DRF flags, the
//! same deliveries in the same order per flow, the same counters.

use super::{
    control_body, encode_data_in_place, Action, Counters, Flow, FlowId, N1Port, NormalError,
    NormalIpcp, Outgoing, Pieces, TX_BURST,
};
use crate::buf::{self, PduBuf};
use crate::delimiting;
use crate::efcp;
use crate::ids::IdMap;
use crate::rmt::{self, QueuedPdu, Rmt};
use crate::sdu::Sdu;
use crate::sdup::Sdup;
use crate::time::Instant;
use rina_wire::pci::{self, Pci, PduType};
use std::collections::VecDeque;

/// What sending a flow's PDUs touches, borrowed apart from the flows.
pub(super) struct Out<'a> {
    cfg: &'a super::NormalConfig,
    data_header: usize,
    /// Room for an SDU's bytes in a PDU (`NormalIpcp::frag_budget`).
    frag_budget: usize,
    sdup: &'a Sdup,
    rmt: &'a mut Rmt,
    through: &'a mut Vec<(N1Port, PduBuf)>,
    /// No SDU protection by the port (encryption) and no capture: a frame
    /// passed through is transmitted at once, as `NormalIpcp::transmit`
    /// would, without waiting in `through`.
    plain_tx: bool,
    loopback: &'a mut VecDeque<Vec<u8>>,
    actions: &'a mut VecDeque<Action>,
    counters: &'a mut Counters,
}

impl NormalIpcp {
    /// The flows, and apart from them what sending their PDUs touches.
    pub(super) fn split_out(&mut self) -> (&mut IdMap<FlowId, Box<Flow>>, Out<'_>) {
        // Frames still waiting in `through` (taken while a capture ran or
        // frames were sealed) go first: none overtakes them.
        let plain_tx = self.tap.is_none()
            && !self.mship.as_ref().is_some_and(|m| m.encrypting())
            && self.through.is_empty();
        (
            &mut self.flows,
            Out {
                cfg: &self.cfg,
                data_header: self.data_header,
                frag_budget: self.frag_budget,
                sdup: &self.sdup,
                rmt: &mut self.rmt,
                through: &mut self.through,
                plain_tx,
                loopback: &mut self.loopback,
                actions: &mut self.actions,
                counters: &mut self.counters,
            },
        )
    }

    /// Hands out what flow `id` delivered, then moves what it has to send
    /// into the RMT.
    pub(super) fn flush_flow(&mut self, now: Instant, id: FlowId) {
        let (flows, mut out) = self.split_out();
        let Some(f) = flows.get_mut(&id) else {
            return;
        };
        // Deliveries first: consuming them may open the peer's window.
        while let Some(d) = f.efcp.poll_deliver() {
            f.deliver(now, id, d.seq, d.payload, out.actions, out.counters);
        }
        while let Some((p, meta)) = f.efcp.poll_transmit_meta(now) {
            out.send(now, f, p, meta);
        }
        if let Some(e) = f.efcp.failure() {
            if !f.failure_reported {
                f.failure_reported = true;
                out.actions.push_back(Action::FlowFailed {
                    flow: id,
                    error: Box::new(e.clone()),
                });
            }
        }
    }
}

impl Out<'_> {
    /// The work of [`NormalIpcp::write`] on flow `f` (`id`), looked up by
    /// the caller: the SDU checked, cut into fragments if it needs more
    /// than one PDU, and each sent or queued ([`Out::send_or_queue`]).
    /// True if something was queued in EFCP (the flow needs a flush).
    #[inline(always)]
    pub(super) fn write_sdu(
        &mut self,
        now: Instant,
        flow: FlowId,
        f: &mut Flow,
        sdu: Outgoing<'_>,
    ) -> Result<bool, NormalError> {
        let max = self.cfg.max_sdu;
        let len = sdu.len();
        if len == 0 || len > max {
            return Err(NormalError::BadSduSize { size: len, max });
        }
        let budget = self.frag_budget;
        let tail = self.sdup.trailer_len() + buf::TAILROOM;
        if let Some(e) = f.efcp.failure() {
            return Err(NormalError::Failed(flow, e.clone()));
        }
        let n = delimiting::fragment_count(len, budget);
        if !f.efcp.can_write() || f.efcp.write_capacity() < n {
            return Err(NormalError::WouldBlock(flow));
        }
        let pieces = if n == 1 {
            // Most SDUs are one fragment, the whole SDU: written as they
            // are, in the buffer they came in when it is their own.
            if budget <= delimiting::DELIMITER_LEN {
                return Err(NormalError::BadSduSize { size: len, max });
            }
            let mut b = match sdu {
                Outgoing::Owned(b) => b,
                sdu => {
                    let src = sdu.source();
                    let Some(b) = PduBuf::with_room_from(buf::HEADROOM, src, 0, len, tail) else {
                        return Err(NormalError::UnreadableSdu(len));
                    };
                    b
                }
            };
            b.push_front(&[delimiting::Delimiter::Complete.to_byte()]);
            Pieces::One(b)
        } else {
            // The one copy of the SDU's bytes on the way down: each
            // fragment into a buffer with room for every header below,
            // all of them read before any is written.
            let src = sdu.source();
            let bad_size = |_| NormalError::BadSduSize { size: len, max };
            let mut pieces: Vec<PduBuf> = Vec::with_capacity(n);
            for (delim, at, n) in delimiting::spans(len, max, budget).map_err(bad_size)? {
                let Some(mut b) = PduBuf::with_room_from(buf::HEADROOM, src, at, n, tail) else {
                    return Err(NormalError::UnreadableSdu(len));
                };
                b.push_front(&[delim.to_byte()]);
                pieces.push(b);
            }
            Pieces::Many(pieces)
        };
        // Without DTCP and with nothing queued, each piece goes to the RMT
        // now; once one is queued (the flow has DTCP policies), so are the
        // rest.
        let mut queued = false;
        match pieces {
            Pieces::One(b) => queued |= self.send_or_queue(now, flow, f, b)?,
            Pieces::Many(v) => {
                for b in v {
                    queued |= self.send_or_queue(now, flow, f, b)?;
                }
            }
        }
        f.counters.sdus_out += 1;
        f.counters.bytes_out += len as u64;
        Ok(queued)
    }
    /// A fragment of an SDU written to flow `f` (`payload`, delimiter
    /// first): without DTCP and with nothing queued, numbered as EFCP's
    /// queue would have numbered it and sent now (false); else written to
    /// EFCP for the flush (true).
    #[inline(always)]
    pub(super) fn send_or_queue(
        &mut self,
        now: Instant,
        id: FlowId,
        f: &mut Flow,
        payload: PduBuf,
    ) -> Result<bool, NormalError> {
        if let Some((seq, drf)) = f.efcp.send_direct(now) {
            let pdu = efcp::Pdu::Data { seq, drf, payload };
            self.send(now, f, pdu, efcp::PduMeta::default());
            return Ok(false);
        }
        // The caller checked there is room; an error is a bug guard.
        f.efcp
            .write(now, payload)
            .map(|()| true)
            .map_err(|e| NormalError::Failed(id, e))
    }

    /// The IPCP's counters.
    pub(super) fn counters(&mut self) -> &mut Counters {
        self.counters
    }

    /// Reports flow `id` failed with `error`.
    pub(super) fn fail(&mut self, id: FlowId, error: efcp::EfcpError) {
        self.actions.push_back(Action::FlowFailed {
            flow: id,
            error: Box::new(error),
        });
    }

    /// Writes the PCI of PDU `p` of flow `f` (in place for data), protects
    /// it and hands it to the RMT; one the policy passes straight through
    /// is transmitted at once, or, if the port protects frames or a
    /// capture runs, waits in `through` to be transmitted after the
    /// flow's turn.
    fn send(&mut self, now: Instant, f: &mut Flow, p: efcp::Pdu, meta: efcp::PduMeta) {
        let dt = &self.cfg.dt;
        let seq_mask = dt.seq.max_value();
        let mut pci = flow_pci(self.cfg.address, f);
        let frame = match p {
            efcp::Pdu::Data { seq, drf, payload } => {
                pci.seq = seq & seq_mask;
                if drf {
                    pci.flags |= pci::flags::DRF;
                }
                encode_data_in_place(dt, self.data_header, &pci, payload)
            }
            control => {
                let (ctrl_seq, body) = control_body(&control, meta.echo, seq_mask);
                if meta.ecn {
                    pci.flags |= pci::flags::ECN;
                }
                encode_control(dt, pci, ctrl_seq, &body)
            }
        };
        let Ok(frame) = frame else {
            self.counters.tx_dropped += 1;
            return;
        };
        self.route(now, f, frame);
    }

    /// Sends a control PDU of flow `f` that EFCP does not make (the
    /// keepalive's), with control sequence number `ctrl_seq`.
    pub(super) fn send_control(
        &mut self,
        now: Instant,
        f: &mut Flow,
        ctrl_seq: u64,
        body: pci::ControlBody,
    ) {
        let pci = flow_pci(self.cfg.address, f);
        match encode_control(&self.cfg.dt, pci, ctrl_seq, &body) {
            Ok(frame) => self.route(now, f, frame),
            Err(_) => self.counters.tx_dropped += 1,
        }
    }

    /// Protects PDU `frame` of flow `f` and hands it to the RMT (or to the
    /// loopback, for a flow to this IPCP).
    fn route(&mut self, now: Instant, f: &mut Flow, mut frame: PduBuf) {
        if f.ep.remote_addr == self.cfg.address {
            self.loopback.push_back(frame.into_vec());
            return;
        }
        let ttl = self.sdup.initial_ttl().unwrap_or(0);
        self.sdup.protect_buf(&mut frame, ttl);
        let q = QueuedPdu {
            qos_id: f.ep.qos_id,
            mgmt: false,
            bytes: frame,
        };
        // A PDU without a route or queue room is lost like on a link;
        // retransmission (where the policy has it) recovers.
        let (dst, hash) = (f.ep.remote_addr, f.hash);
        match self
            .rmt
            .send_through_memo(now, dst, hash, &mut f.route, q, TX_BURST)
        {
            Ok(rmt::Through::Queued(_)) => {}
            Ok(rmt::Through::Now(port, frame)) if self.plain_tx => {
                self.counters.tx_frames += 1;
                self.actions.push_back(Action::Transmit { port, frame });
            }
            Ok(rmt::Through::Now(port, frame)) => {
                self.through.push((port, frame));
            }
            Err(_) => self.counters.tx_dropped += 1,
        }
    }
}

/// The PCI of a DT PDU of flow `f` from `address` (the type and sequence
/// number set by the caller).
fn flow_pci(address: rmt::Address, f: &Flow) -> Pci {
    let mut pci = Pci::new(PduType::Dt);
    pci.src_addr = address;
    pci.dst_addr = f.ep.remote_addr;
    pci.qos_id = f.ep.qos_id;
    pci.src_cep = f.ep.local_cep;
    pci.dst_cep = f.ep.remote_cep;
    pci
}

/// A control PDU with `pci` (its type and sequence number set from
/// `body` and `ctrl_seq`), encoded.
fn encode_control(
    dt: &pci::DtConstants,
    mut pci: Pci,
    ctrl_seq: u64,
    body: &pci::ControlBody,
) -> Result<PduBuf, rina_wire::WireError> {
    pci.pdu_type = body.pdu_type();
    pci.seq = ctrl_seq & dt.ctrl_seq.max_value();
    let mut frame = PduBuf::empty(buf::HEADROOM, 64);
    let (v, _) = frame.parts_mut();
    pci::encode_control(dt, &pci, body, v).map(|()| frame)
}

impl Flow {
    /// Whether EFCP still holds SDUs written to the flow: queued for the
    /// window, or sent and not yet acknowledged (a failed flow holds
    /// nothing it will send).
    pub(super) fn still_sending(&self) -> bool {
        self.efcp.failure().is_none()
            && (self.efcp.send_queue_len() > 0 || self.efcp.in_flight() > 0)
    }

    /// Hands a fragment EFCP delivered (`seq`, delimiter first) to the
    /// reassembler, and a whole SDU to the driver.
    pub(super) fn deliver(
        &mut self,
        now: Instant,
        id: FlowId,
        seq: u64,
        payload: PduBuf,
        actions: &mut VecDeque<Action>,
        counters: &mut Counters,
    ) {
        self.fragments += 1;
        let payload = match self.reasm.push_whole(seq, payload) {
            Ok(sdu) => return self.hand_over(now, id, sdu, actions),
            Err(payload) => payload,
        };
        let before = self.reasm.discarded();
        let res = self.reasm.push_buf(now, seq, payload);
        if self.reasm.discarded() > before || res.is_err() {
            // Fragments the reassembler threw away hold no buffer any
            // more: give their credit back. The newest fragment keeps its
            // own if it started a new SDU, or is a whole SDU handed over
            // now (else a peer alternating first and complete fragments
            // had SDUs delivered that held no credit, without bound).
            let kept = match &res {
                Ok(Some(_)) => 1,
                Ok(None) => usize::from(self.reasm.partial_len() > 0),
                Err(_) => 0,
            };
            self.efcp.consumed(now, self.fragments - kept);
            self.fragments = kept;
            if res.is_err() {
                counters.rx_bad_fragments += 1;
            }
        }
        if let Ok(Some(sdu)) = res {
            self.hand_over(now, id, sdu, actions);
        }
    }

    /// Hands the whole SDU `sdu` of flow `id` to the driver, its fragments
    /// consumed now (auto-consume) or when the application says so.
    fn hand_over(&mut self, now: Instant, id: FlowId, sdu: Sdu, actions: &mut VecDeque<Action>) {
        self.counters.sdus_in += 1;
        self.counters.bytes_in += sdu.len() as u64;
        let n = std::mem::take(&mut self.fragments);
        if self.auto_consume {
            self.efcp.consumed(now, n);
        } else {
            self.unconsumed.push_back(n);
        }
        actions.push_back(Action::Deliver { flow: id, sdu });
    }
}
