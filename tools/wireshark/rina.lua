-- Wireshark dissector for this project's RINA wire formats.
--
--   tshark -X lua_script:tools/wireshark/rina.lua -r capture.pcap
--   (or copy it to ~/.local/lib/wireshark/plugins/)
--
-- Protocols (filter names):
--   rina.shim_udp  shim DIF over UDP: 1-byte type, then (crates/rina-wire/src/shim_udp.rs)
--                  DATA dst_port u32 + SDU; ALLOC_REQ src_port u32, QoS (29 B),
--                  src and dst names (u16 length + UTF-8), optional direct
--                  UDP port u16; ALLOC_RESP dst_port, src_port, result u8,
--                  max_sdu u32, reason, optional direct UDP port u16;
--                  DEALLOC dst_port, src_port; KEEPALIVE flags u8 (1: a
--                  probe, to be answered), then (dst_port, src_port) pairs.
--                  Found by a heuristic on any UDP port, or by "Decode As".
--   rina.efcp      a normal DIF's PDU inside a shim SDU: the SDU-protection TTL
--                  byte, the PCI (crates/rina-wire/src/pci.rs; field widths are
--                  preferences, defaulting to the DIF defaults 2/2/2/2/4/4/4/4),
--                  the control body or the payload, and the CRC-32 if enabled.
--                  On a DIF that encrypts its N-1 flows, all that behind a
--                  marker byte: 0x00 in clear, or 0xAE, key id u32 and
--                  sequence u64, then the sealed bytes and a 16-byte tag
--                  (crates/rina-core/src/sdup/aead.rs; the key is not known here).
--                  Every field is in network byte order.
--   rina.mgmt      the payload of a management PDU: a one-byte discriminator
--                  (0xC0 CDAP, which carries every management message: enrollment, hellos,
--                  port authentication, the flow allocator, routing, the directory; 0xF6 a
--                  fragment of a larger one, reassembled in the frame that completes it; and, from older versions, 0xE0 enrollment, 0xE1
--                  hello, 0xFA the flow allocator before it spoke CDAP) and what follows.
--   rina.cdap      CDAP messages (protobuf; crates/rina-wire/src/cdap.rs field numbers).
--   rina.shim_eth  shim DIF over Ethernet: EtherType 0xD1F0 frames, and ARP
--                  (EtherType 0x0806) whose protocol type is 0xD1F0, with the
--                  application names as protocol addresses
--                  (crates/rina-wire/src/shim_eth.rs).
--   rina.n1        `rinactl capture` files (link type USER0, 147): an 8-byte
--                  pseudo-header (version, direction, 2 reserved, N-1 port-id
--                  u32) before each frame a normal IPCP sent or received on
--                  an N-1 flow (crates/rina-wire/src/pcap.rs), then rina.efcp.
--   rina.vmpi      `rinactl capture` of a shim-hv (link type USER1, 148): the
--                  same pseudo-header with the device's VMPI-id in place of the
--                  port-id, then the VMPI buffer: channel u32 (little-endian);
--                  channel 0 carries control messages (command u8, channel u32,
--                  then names NUL-terminated or response u8 and reason;
--                  crates/rina-core/src/shim_hv/vmpi.rs), other channels an SDU
--                  (rina.efcp when it holds a normal DIF's PDU).
--                  `rinactl capture` of a shim-udp writes IP/UDP packets (link
--                  type RAW) and of a shim-eth Ethernet frames: the dissectors
--                  above decode them.

local NAME_TYPES = { [1] = "DATA", [2] = "ALLOC_REQ", [3] = "ALLOC_RESP", [4] = "DEALLOC", [5] = "KEEPALIVE" }
local ALLOC_RESULTS = {
    [0] = "accepted", [1] = "not registered", [2] = "refused",
    [3] = "QoS not satisfiable", [4] = "no resources",
}
local PDU_TYPES = {
    [0x80] = "DT", [0x40] = "MGMT", [0xC0] = "CACK", [0xC1] = "ACK", [0xC2] = "NACK",
    [0xC4] = "FC", [0xC5] = "ACK_FC", [0xC6] = "NACK_FC", [0xCF] = "RENDEZVOUS",
}
local DELIMITERS = { [0x07] = "complete SDU", [0x05] = "first fragment",
    [0x04] = "middle fragment", [0x06] = "last fragment" }
local MGMT_KINDS = { [0xC0] = "CDAP", [0xE0] = "enrollment (CDAP, older versions)",
    [0xE1] = "hello (CDAP, older versions)",
    [0xFA] = "flow allocator (before CDAP)", [0xF6] = "fragment" }
local FA_TYPES = { [1] = "REQUEST", [2] = "RESPONSE", [3] = "DEALLOC" }
local OPCODES = {
    [0] = "M_CONNECT", [1] = "M_CONNECT_R", [2] = "M_RELEASE", [3] = "M_RELEASE_R",
    [4] = "M_CREATE", [5] = "M_CREATE_R", [6] = "M_DELETE", [7] = "M_DELETE_R",
    [8] = "M_READ", [9] = "M_READ_R", [10] = "M_CANCELREAD", [11] = "M_CANCELREAD_R",
    [12] = "M_WRITE", [13] = "M_WRITE_R", [14] = "M_START", [15] = "M_START_R",
    [16] = "M_STOP", [17] = "M_STOP_R",
}
local CDAP_FLAGS = { [0] = "none", [1] = "sync", [2] = "read incomplete" }
local ARP_OPS = { [1] = "request", [2] = "reply" }

-- ---------------------------------------------------------------- shim-udp
local p_udp = Proto("rina_shim_udp", "RINA shim DIF over UDP")
local fu = {
    type = ProtoField.uint8("rina.shim_udp.type", "Type", base.HEX, NAME_TYPES),
    dst_port = ProtoField.uint32("rina.shim_udp.dst_port", "Destination port-id"),
    src_port = ProtoField.uint32("rina.shim_udp.src_port", "Source port-id"),
    probe = ProtoField.uint8("rina.shim_udp.probe", "Probe (answer wanted)", base.DEC, { [0] = "no: an answer", [1] = "yes" }),
    qos = ProtoField.bytes("rina.shim_udp.qos", "QoS spec"),
    qos_flags = ProtoField.uint8("rina.qos.flags", "Flags", base.HEX),
    qos_in_order = ProtoField.bool("rina.qos.in_order", "In order", 8, nil, 0x01),
    qos_reliable = ProtoField.bool("rina.qos.reliable", "Reliable", 8, nil, 0x02),
    qos_delay = ProtoField.uint64("rina.qos.max_delay_us", "Max delay (us)"),
    qos_loss = ProtoField.uint32("rina.qos.max_loss_ppm", "Max loss (ppm)"),
    qos_bw = ProtoField.uint64("rina.qos.avg_bandwidth_bps", "Average bandwidth (b/s)"),
    qos_gap = ProtoField.uint32("rina.qos.max_sdu_gap", "Max SDU gap"),
    qos_sdu = ProtoField.uint32("rina.qos.max_sdu_size", "Max SDU size"),
    src_name = ProtoField.string("rina.shim_udp.src_name", "Source application"),
    dst_name = ProtoField.string("rina.shim_udp.dst_name", "Destination application"),
    result = ProtoField.uint8("rina.shim_udp.result", "Result", base.DEC, ALLOC_RESULTS),
    max_sdu = ProtoField.uint32("rina.shim_udp.max_sdu", "Max SDU"),
    reason = ProtoField.string("rina.shim_udp.reason", "Reason"),
    direct = ProtoField.uint16("rina.shim_udp.direct_port", "Direct flow's UDP port"),
    sdu = ProtoField.bytes("rina.shim_udp.sdu", "SDU"),
}
p_udp.fields = fu
p_udp.prefs.heuristic = Pref.bool("Find shim-udp on any UDP port", true,
    "Recognise shim-udp datagrams by their structure, whatever the port")
p_udp.prefs.efcp = Pref.enum("SDUs hold normal-DIF PDUs", 1,
    "Decode shim SDUs as EFCP PDUs: auto (when the PCI's version and length fields fit), always, never", {
    { 1, "auto", 1 },
    { 2, "always", 2 },
    { 3, "never", 3 },
}, false)

-- ------------------------------------------------------------------- EFCP
local p_efcp = Proto("rina_efcp", "RINA EFCP (normal DIF PDU)")
-- Field widths in bytes (1, 2, 4 or 8), as the DIF's data-transfer
-- constants say; the defaults are rinad's (DtConstants::default).
p_efcp.prefs.addr = Pref.uint("Address width", 2, "Bytes of dst_addr and src_addr (1, 2, 4 or 8)")
p_efcp.prefs.cep = Pref.uint("CEP-id width", 2, "Bytes of dst_cep and src_cep")
p_efcp.prefs.qos = Pref.uint("QoS-id width", 2, "Bytes of qos_id")
p_efcp.prefs.length = Pref.uint("Length width", 2, "Bytes of the length field")
p_efcp.prefs.seq = Pref.uint("Sequence number width", 4, "Bytes of DT/MGMT sequence numbers, window edges, ack/nack numbers")
p_efcp.prefs.ctrl_seq = Pref.uint("Control sequence number width", 4, "Bytes of control sequence numbers")
p_efcp.prefs.rate = Pref.uint("Rate width", 4, "Bytes of the rate in flow-control PDUs")
p_efcp.prefs.frame = Pref.uint("Time frame width", 4, "Bytes of the rate's time frame")
p_efcp.prefs.ttl = Pref.bool("TTL byte before the PCI", true, "SDU protection hop limit (ttl = 0 in rinad turns it off)")
p_efcp.prefs.crc = Pref.bool("CRC-32 after the PDU", false, "SDU protection error check (crc = true in rinad)")
p_efcp.prefs.aead = Pref.enum("N-1 flow encryption marker", 1,
    "Frames of a DIF that encrypts its N-1 flows start with 0x00 (clear) or 0xAE (sealed): " ..
    "auto (recognised when the frame is not a plain PDU), always, never", {
    { 1, "auto", 1 },
    { 2, "always", 2 },
    { 3, "never", 3 },
}, false)

local fe = {
    ttl = ProtoField.uint8("rina.efcp.ttl", "TTL"),
    version = ProtoField.uint8("rina.efcp.version", "Version"),
    dst_addr = ProtoField.uint64("rina.efcp.dst_addr", "Destination address"),
    src_addr = ProtoField.uint64("rina.efcp.src_addr", "Source address"),
    qos_id = ProtoField.uint64("rina.efcp.qos_id", "QoS-id"),
    dst_cep = ProtoField.uint64("rina.efcp.dst_cep", "Destination CEP-id"),
    src_cep = ProtoField.uint64("rina.efcp.src_cep", "Source CEP-id"),
    pdu_type = ProtoField.uint8("rina.efcp.pdu_type", "PDU type", base.HEX, PDU_TYPES),
    flags = ProtoField.uint8("rina.efcp.flags", "Flags", base.HEX),
    drf = ProtoField.bool("rina.efcp.flags.drf", "Data run flag", 8, nil, 0x80),
    ecn = ProtoField.bool("rina.efcp.flags.ecn", "ECN", 8, nil, 0x01),
    length = ProtoField.uint64("rina.efcp.length", "Length"),
    seq = ProtoField.uint64("rina.efcp.seq", "Sequence number"),
    ctrl_seq = ProtoField.uint64("rina.efcp.ctrl_seq", "Control sequence number"),
    ack_sn = ProtoField.uint64("rina.efcp.ack_sn", "Ack sequence number"),
    nack_sn = ProtoField.uint64("rina.efcp.nack_sn", "Nack sequence number"),
    last_ctrl_seq_rcvd = ProtoField.uint64("rina.efcp.last_ctrl_seq_rcvd", "Last control sequence number received"),
    new_lwe = ProtoField.uint64("rina.efcp.new_lwe", "New left window edge"),
    new_rwe = ProtoField.uint64("rina.efcp.new_rwe", "New right window edge"),
    my_lwe = ProtoField.uint64("rina.efcp.my_lwe", "My left window edge"),
    my_rwe = ProtoField.uint64("rina.efcp.my_rwe", "My right window edge"),
    rate = ProtoField.uint64("rina.efcp.rate", "Rate"),
    frame = ProtoField.uint64("rina.efcp.frame", "Time frame"),
    delimiter = ProtoField.uint8("rina.efcp.delimiter", "Delimiter", base.HEX, DELIMITERS),
    user_data = ProtoField.bytes("rina.efcp.user_data", "User data"),
    padding = ProtoField.bytes("rina.efcp.padding", "Padding"),
    crc = ProtoField.uint32("rina.efcp.crc", "CRC-32", base.HEX),
    aead = ProtoField.uint8("rina.efcp.aead.marker", "N-1 flow encryption", base.HEX,
        { [0x00] = "clear", [0xAE] = "sealed" }),
    aead_key = ProtoField.uint32("rina.efcp.aead.key_id", "Key id", base.HEX),
    aead_seq = ProtoField.uint64("rina.efcp.aead.seq", "Sequence number"),
    aead_sealed = ProtoField.bytes("rina.efcp.aead.sealed", "Sealed frame (AES-256-GCM)"),
    aead_tag = ProtoField.bytes("rina.efcp.aead.tag", "Authentication tag"),
}
p_efcp.fields = fe
local e_efcp = ProtoExpert.new("rina.efcp.misfit", "Not a PDU as the preferences describe it",
    expert.group.MALFORMED, expert.severity.WARN)
p_efcp.experts = { e_efcp }

-- ------------------------------------------------------------- management
local p_mgmt = Proto("rina_mgmt", "RINA layer management")
local fm = {
    kind = ProtoField.uint8("rina.mgmt.kind", "Kind", base.HEX, MGMT_KINDS),
    fa_type = ProtoField.uint8("rina.mgmt.fa.type", "Flow allocator message", base.HEX, FA_TYPES),
    fa_src_addr = ProtoField.uint64("rina.mgmt.fa.src_addr", "Source address"),
    fa_dst_cep = ProtoField.uint64("rina.mgmt.fa.dst_cep", "Destination CEP-id"),
    fa_src_cep = ProtoField.uint64("rina.mgmt.fa.src_cep", "Source CEP-id"),
    fa_qos_id = ProtoField.uint64("rina.mgmt.fa.qos_id", "QoS-id"),
    fa_src_name = ProtoField.string("rina.mgmt.fa.src_name", "Source application"),
    fa_dst_name = ProtoField.string("rina.mgmt.fa.dst_name", "Destination application"),
    fa_result = ProtoField.uint8("rina.mgmt.fa.result", "Result", base.DEC, ALLOC_RESULTS),
    fa_max_sdu = ProtoField.uint32("rina.mgmt.fa.max_sdu", "Max SDU"),
    fa_reason = ProtoField.string("rina.mgmt.fa.reason", "Reason"),
    frag_msg_id = ProtoField.uint32("rina.mgmt.frag.msg_id", "Message id"),
    frag_index = ProtoField.uint16("rina.mgmt.frag.index", "Fragment index"),
    frag_count = ProtoField.uint16("rina.mgmt.frag.count", "Fragment count"),
    frag_total = ProtoField.uint32("rina.mgmt.frag.total_len", "Message length"),
    frag_data = ProtoField.bytes("rina.mgmt.frag.data", "Fragment data"),
    frag_reassembled = ProtoField.framenum("rina.mgmt.frag.reassembled_in",
        "Reassembled in frame"),
}
p_mgmt.fields = fm
local e_mgmt = ProtoExpert.new("rina.mgmt.malformed", "Malformed management message",
    expert.group.MALFORMED, expert.severity.ERROR)
p_mgmt.experts = { e_mgmt }

-- Management fragments put back together. In the first pass over a
-- capture, the pieces seen so far, by sender and receiver (the frame's
-- addresses and ports) and message id; the whole message by the number of
-- the frame that completed it, for that pass and any later one (the
-- frames of the message point to it).
local frag_pending = {}
local frag_whole = {}
local frag_done_in = {}
-- Pieces kept at most (a capture of broken senders must not grow this
-- without end): beyond, the oldest messages are forgotten.
local FRAG_MAX_PENDING = 256
local frag_order = {}

function p_mgmt.init()
    frag_pending, frag_whole, frag_done_in, frag_order = {}, {}, {}, {}
end

-- Takes the fragment in `tvb` (discriminator, header, piece); returns the
-- whole message as a ByteArray if this frame completed it.
local function reassemble(tvb, pinfo)
    local n = pinfo.number
    local id = tvb(1, 4):uint()
    local key = tostring(pinfo.src) .. ":" .. tostring(pinfo.src_port) .. ">" ..
        tostring(pinfo.dst) .. ":" .. tostring(pinfo.dst_port) .. "#" .. id
    if pinfo.visited then
        return frag_whole[n], frag_done_in[key .. "@" .. n]
    end
    local index, count, total = tvb(5, 2):uint(), tvb(7, 2):uint(), tvb(9, 4):uint()
    if count == 0 then
        return nil
    end
    local m = frag_pending[key]
    if m == nil or m.count ~= count or m.total ~= total then
        m = { count = count, total = total, parts = {}, have = 0, frames = {} }
        frag_pending[key] = m
        table.insert(frag_order, key)
        if #frag_order > FRAG_MAX_PENDING then
            frag_pending[table.remove(frag_order, 1)] = nil
        end
    end
    if index < count and m.parts[index] == nil then
        m.parts[index] = tvb(13):bytes()
        m.have = m.have + 1
        m.frames[#m.frames + 1] = n
    end
    if m.have < count then
        return nil
    end
    frag_pending[key] = nil
    local whole = ByteArray.new()
    for i = 0, count - 1 do
        whole:append(m.parts[i])
    end
    if whole:len() ~= total then
        return nil
    end
    frag_whole[n] = whole
    for _, f in ipairs(m.frames) do
        frag_done_in[key .. "@" .. f] = n
    end
    return whole, n
end

-- ------------------------------------------------------------------- CDAP
local p_cdap = Proto("rina_cdap", "RINA CDAP")
local fc = {
    abs_syntax = ProtoField.int32("rina.cdap.abs_syntax", "Abstract syntax"),
    opcode = ProtoField.uint32("rina.cdap.opcode", "Opcode", base.DEC, OPCODES),
    invoke_id = ProtoField.int32("rina.cdap.invoke_id", "Invoke id"),
    flags = ProtoField.uint32("rina.cdap.flags", "Flags", base.DEC, CDAP_FLAGS),
    obj_class = ProtoField.string("rina.cdap.obj_class", "Object class"),
    obj_name = ProtoField.string("rina.cdap.obj_name", "Object name"),
    obj_inst = ProtoField.int64("rina.cdap.obj_inst", "Object instance"),
    obj_value = ProtoField.bytes("rina.cdap.obj_value", "Object value"),
    result = ProtoField.int32("rina.cdap.result", "Result"),
    scope = ProtoField.int32("rina.cdap.scope", "Scope"),
    filter = ProtoField.bytes("rina.cdap.filter", "Filter"),
    auth_policy = ProtoField.bytes("rina.cdap.auth_policy", "Authentication policy"),
    dest_ae_inst = ProtoField.string("rina.cdap.dest_ae_inst", "Destination AE instance"),
    dest_ae_name = ProtoField.string("rina.cdap.dest_ae_name", "Destination AE name"),
    dest_ap_inst = ProtoField.string("rina.cdap.dest_ap_inst", "Destination AP instance"),
    dest_ap_name = ProtoField.string("rina.cdap.dest_ap_name", "Destination AP name"),
    src_ae_inst = ProtoField.string("rina.cdap.src_ae_inst", "Source AE instance"),
    src_ae_name = ProtoField.string("rina.cdap.src_ae_name", "Source AE name"),
    src_ap_inst = ProtoField.string("rina.cdap.src_ap_inst", "Source AP instance"),
    src_ap_name = ProtoField.string("rina.cdap.src_ap_name", "Source AP name"),
    result_reason = ProtoField.string("rina.cdap.result_reason", "Result reason"),
    version = ProtoField.int64("rina.cdap.version", "Version"),
    unknown = ProtoField.bytes("rina.cdap.unknown", "Unknown field"),
    intval = ProtoField.int64("rina.cdap.value.int", "Integer value"),
    strval = ProtoField.string("rina.cdap.value.string", "String value"),
    byteval = ProtoField.bytes("rina.cdap.value.bytes", "Bytes value"),
    boolval = ProtoField.bool("rina.cdap.value.bool", "Boolean value"),
    fixedval = ProtoField.bytes("rina.cdap.value.fixed", "Float or double value"),
}
p_cdap.fields = fc
local e_cdap = ProtoExpert.new("rina.cdap.malformed", "Malformed CDAP message",
    expert.group.MALFORMED, expert.severity.ERROR)
p_cdap.experts = { e_cdap }

-- ---------------------------------------------------------------- shim-eth
local p_eth = Proto("rina_shim_eth", "RINA shim DIF over Ethernet")
local fa = {
    htype = ProtoField.uint16("rina.shim_eth.arp.htype", "Hardware type"),
    ptype = ProtoField.uint16("rina.shim_eth.arp.ptype", "Protocol type", base.HEX),
    hlen = ProtoField.uint8("rina.shim_eth.arp.hlen", "Hardware address length"),
    plen = ProtoField.uint8("rina.shim_eth.arp.plen", "Protocol address length"),
    op = ProtoField.uint16("rina.shim_eth.arp.op", "Operation", base.DEC, ARP_OPS),
    sha = ProtoField.ether("rina.shim_eth.arp.sha", "Sender MAC"),
    spa = ProtoField.string("rina.shim_eth.arp.spa", "Sender application"),
    tha = ProtoField.ether("rina.shim_eth.arp.tha", "Target MAC"),
    tpa = ProtoField.string("rina.shim_eth.arp.tpa", "Target application"),
    sdu = ProtoField.bytes("rina.shim_eth.sdu", "SDU"),
}
p_eth.fields = fa

-- ---------------------------------------------------------------- helpers

-- A width preference; anything but 1, 2, 4 or 8 falls back to `default`.
local function width(pref, default)
    if pref == 1 or pref == 2 or pref == 4 or pref == 8 then
        return pref
    end
    return default
end

-- The PCI field widths the preferences say.
local function widths()
    local P = p_efcp.prefs
    return {
        addr = width(P.addr, 2), cep = width(P.cep, 2), qos = width(P.qos, 2),
        length = width(P.length, 2), seq = width(P.seq, 4), ctrl_seq = width(P.ctrl_seq, 4),
        rate = width(P.rate, 4), frame = width(P.frame, 4),
    }
end

-- Adds a network-order integer field of `w` bytes at `off`; returns its
-- value (a UInt64) and the next offset, or nil if the bytes are not there.
local function add_uint(tree, field, tvb, off, w)
    if off + w > tvb:len() then
        return nil, off
    end
    local r = tvb(off, w)
    local v = r:uint64()
    tree:add(field, r, v)
    return v, off + w
end

-- A u16-length-prefixed UTF-8 string; returns it and the next offset.
local function add_str16(tree, field, tvb, off)
    if off + 2 > tvb:len() then
        return nil, off
    end
    local n = tvb(off, 2):uint()
    if off + 2 + n > tvb:len() then
        return nil, off
    end
    local s = n > 0 and tvb(off + 2, n):string(ENC_UTF_8) or ""
    tree:add(field, tvb(off, 2 + n), s)
    return s, off + 2 + n
end

-- A QoS spec (crates/rina-wire/src/qos.rs): flags, then delay u64, loss
-- u32, bandwidth u64, gap u32, SDU size u32; a value counts only if its
-- flag bit (0x04 delay, 0x08 loss, 0x10 bandwidth, 0x20 gap, 0x40 size) is set.
local function add_qos(tree, tvb, off)
    if off + 29 > tvb:len() then
        return
    end
    local t = tree:add(fu.qos, tvb(off, 29))
    local f = t:add(fu.qos_flags, tvb(off, 1))
    f:add(fu.qos_in_order, tvb(off, 1))
    f:add(fu.qos_reliable, tvb(off, 1))
    local flags = tvb(off, 1):uint()
    local function bit(b)
        return math.floor(flags / b) % 2 == 1
    end
    if bit(0x04) then t:add(fu.qos_delay, tvb(off + 1, 8)) end
    if bit(0x08) then t:add(fu.qos_loss, tvb(off + 9, 4)) end
    if bit(0x10) then t:add(fu.qos_bw, tvb(off + 13, 8)) end
    if bit(0x20) then t:add(fu.qos_gap, tvb(off + 21, 4)) end
    if bit(0x40) then t:add(fu.qos_sdu, tvb(off + 25, 4)) end
end

-- Control body fields, in wire order, per PDU type.
local BODIES = {
    [0xC1] = { { "ack_sn", "seq" } },
    [0xC2] = { { "nack_sn", "seq" } },
    [0xC4] = { { "new_rwe", "seq" }, { "my_lwe", "seq" }, { "my_rwe", "seq" }, { "rate", "rate" }, { "frame", "frame" } },
}
local WINDOW = { { "last_ctrl_seq_rcvd", "ctrl_seq" }, { "new_lwe", "seq" }, { "new_rwe", "seq" },
    { "my_lwe", "seq" }, { "my_rwe", "seq" }, { "rate", "rate" }, { "frame", "frame" } }
BODIES[0xC0] = WINDOW
BODIES[0xCF] = WINDOW
BODIES[0xC5] = { { "ack_sn", "seq" }, table.unpack(WINDOW) }
BODIES[0xC6] = { { "nack_sn", "seq" }, table.unpack(WINDOW) }

-- ------------------------------------------------------------------- CDAP

-- Reads a protobuf varint at `off`; returns its value (a Lua number, exact
-- up to 2^53), the next offset and the value as an exact UInt64, or nil.
local function varint(tvb, off)
    local v, mul, u = 0, 1, UInt64(0)
    for i = 0, 9 do
        if off + i >= tvb:len() then
            return nil
        end
        local b = tvb(off + i, 1):uint()
        v = v + (b % 128) * mul
        mul = mul * 128
        u = u:bor(UInt64(b % 128):lshift(7 * i))
        if b < 128 then
            return v, off + i + 1, u
        end
    end
    return nil
end

-- Protobuf int32/int64 are two's complement in 64 bits: the Int64 whose
-- bits are those of the UInt64 `u` (exact; Lua numbers lose the low
-- bits of negative values).
local function signed(u)
    return Int64(u:lower(), u:higher())
end

-- The object value (ObjVal, crates/rina-wire/src/cdap.rs): one of int32
-- (1), sint32 (2), int64 (3), sint64 (4), string (5), bytes (6), float (7),
-- double (8), bool (9). Anything else is left as raw bytes.
local function add_objval(t, tvb)
    local off = 0
    while off < tvb:len() do
        local key, after = varint(tvb, off)
        if not key then
            return
        end
        local num, wt = math.floor(key / 8), key % 8
        if wt == 0 then
            local v, nxt, u = varint(tvb, after)
            if not v then
                return
            end
            local r = tvb(off, nxt - off)
            if num == 9 then
                t:add(fc.boolval, r, v ~= 0)
            elseif num == 2 or num == 4 then
                -- zigzag: 2n for n >= 0, -2n - 1 for n < 0
                local half = signed(u:rshift(1))
                t:add(fc.intval, r, u:band(1):tonumber() == 0 and half or -half - 1)
            else
                t:add(fc.intval, r, signed(u))
            end
            off = nxt
        elseif wt == 2 then
            local n, start = varint(tvb, after)
            if not n or start + n > tvb:len() then
                return
            end
            if num == 5 then
                t:add(fc.strval, tvb(off, start + n - off), n > 0 and tvb(start, n):string(ENC_UTF_8) or "")
            elseif n > 0 then
                t:add(fc.byteval, tvb(start, n))
            end
            off = start + n
        elseif (wt == 5 or wt == 1) and after + (wt == 5 and 4 or 8) <= tvb:len() then
            local w = wt == 5 and 4 or 8
            t:add(fc.fixedval, tvb(after, w))
            off = after + w
        else
            return
        end
    end
end

local CDAP_FIELDS = {
    [1] = { fc.abs_syntax, "int" }, [2] = { fc.opcode, "uint" }, [3] = { fc.invoke_id, "int" },
    [4] = { fc.flags, "uint" }, [5] = { fc.obj_class, "string" }, [6] = { fc.obj_name, "string" },
    [7] = { fc.obj_inst, "int64" }, [8] = { fc.obj_value, "bytes" }, [9] = { fc.result, "int" },
    [10] = { fc.scope, "int" }, [11] = { fc.filter, "bytes" }, [18] = { fc.auth_policy, "bytes" },
    [19] = { fc.dest_ae_inst, "string" }, [20] = { fc.dest_ae_name, "string" },
    [21] = { fc.dest_ap_inst, "string" }, [22] = { fc.dest_ap_name, "string" },
    [23] = { fc.src_ae_inst, "string" }, [24] = { fc.src_ae_name, "string" },
    [25] = { fc.src_ap_inst, "string" }, [26] = { fc.src_ap_name, "string" },
    [27] = { fc.result_reason, "string" }, [28] = { fc.version, "int64" },
}

-- Dissects one CDAP message filling `tvb`; returns its opcode name and
-- object name (for the Info column), or nil if it is not valid protobuf.
local function dissect_cdap(tvb, pinfo, tree)
    local t = tree:add(p_cdap, tvb())
    local off, op, name = 0, nil, nil
    while off < tvb:len() do
        local key, after = varint(tvb, off)
        if not key then
            t:add_proto_expert_info(e_cdap, "bad field key")
            return nil
        end
        local num, wt = math.floor(key / 8), key % 8
        local spec = CDAP_FIELDS[num]
        if wt == 0 then
            local v, nxt, u = varint(tvb, after)
            if not v then
                t:add_proto_expert_info(e_cdap, "bad varint")
                return nil
            end
            local r = tvb(off, nxt - off)
            if spec and spec[2] == "int64" then
                t:add(spec[1], r, signed(u))
            elseif spec and spec[2] == "int" then
                -- int32 on the wire is sign-extended to 64 bits.
                t:add(spec[1], r, signed(u):tonumber())
            elseif spec and spec[2] == "uint" then
                t:add(spec[1], r, v)
            else
                t:add(fc.unknown, r)
            end
            if num == 2 then
                op = v
            end
            off = nxt
        elseif wt == 2 then
            local n, start = varint(tvb, after)
            if not n or start + n > tvb:len() then
                t:add_proto_expert_info(e_cdap, "bad length")
                return nil
            end
            local r = tvb(off, start + n - off)
            if spec and spec[2] == "string" then
                local s = n > 0 and tvb(start, n):string(ENC_UTF_8) or ""
                t:add(spec[1], r, s)
                if num == 6 then
                    name = s
                end
            elseif num == 8 and n > 0 then
                add_objval(t:add(spec[1], tvb(start, n)), tvb(start, n):tvb())
            elseif spec and spec[2] == "bytes" and n > 0 then
                t:add(spec[1], tvb(start, n))
            else
                t:add(fc.unknown, r)
            end
            off = start + n
        elseif wt == 5 or wt == 1 then
            local w = wt == 5 and 4 or 8
            if after + w > tvb:len() then
                t:add_proto_expert_info(e_cdap, "field cut short")
                return nil
            end
            t:add(fc.unknown, tvb(off, after - off + w))
            off = after + w
        else
            t:add_proto_expert_info(e_cdap, "bad wire type " .. wt)
            return nil
        end
    end
    if op == nil then
        t:add_proto_expert_info(e_cdap, "no opcode")
        return nil
    end
    local summary = (OPCODES[op] or ("opcode " .. op)) .. (name and (" " .. name) or "")
    t:append_text(", " .. summary)
    return summary
end

-- ------------------------------------------------------------- management

local function dissect_fa(tvb, t)
    local ft = tvb(1, 1):uint()
    t:add(fm.fa_type, tvb(1, 1))
    local off = 2
    local summary = "FA " .. (FA_TYPES[ft] or "?")
    if ft == 1 then
        _, off = add_uint(t, fm.fa_src_addr, tvb, off, 8)
        _, off = add_uint(t, fm.fa_src_cep, tvb, off, 8)
        _, off = add_uint(t, fm.fa_qos_id, tvb, off, 8)
        add_qos(t, tvb, off)
        off = off + 29
        local s, d
        s, off = add_str16(t, fm.fa_src_name, tvb, off)
        d, off = add_str16(t, fm.fa_dst_name, tvb, off)
        summary = summary .. " " .. (s or "?") .. " -> " .. (d or "?")
    elseif ft == 2 then
        _, off = add_uint(t, fm.fa_dst_cep, tvb, off, 8)
        _, off = add_uint(t, fm.fa_src_cep, tvb, off, 8)
        if off + 5 <= tvb:len() then
            t:add(fm.fa_result, tvb(off, 1))
            summary = summary .. " " .. (ALLOC_RESULTS[tvb(off, 1):uint()] or "?")
            t:add(fm.fa_max_sdu, tvb(off + 1, 4))
            add_str16(t, fm.fa_reason, tvb, off + 5)
        end
    elseif ft == 3 then
        _, off = add_uint(t, fm.fa_dst_cep, tvb, off, 8)
        add_uint(t, fm.fa_src_cep, tvb, off, 8)
    end
    return summary
end

-- A management payload: discriminator and contents; returns a summary.
local dissect_mgmt
function dissect_mgmt(tvb, pinfo, tree, reassembled)
    if tvb:len() == 0 then
        return "empty"
    end
    local t = tree:add(p_mgmt, tvb())
    local kind = tvb(0, 1):uint()
    if MGMT_KINDS[kind] then
        t:add(fm.kind, tvb(0, 1))
    end
    if kind == 0xFA and tvb:len() >= 2 then
        return dissect_fa(tvb, t)
    elseif kind == 0xF6 and reassembled then
        -- As the daemon: a reassembled message is never itself a fragment.
        t:add_proto_expert_info(e_mgmt, "fragment inside a reassembled message")
        return "fragment inside a reassembled message (malformed)"
    elseif kind == 0xF6 and tvb:len() >= 13 then
        t:add(fm.frag_msg_id, tvb(1, 4))
        t:add(fm.frag_index, tvb(5, 2))
        t:add(fm.frag_count, tvb(7, 2))
        t:add(fm.frag_total, tvb(9, 4))
        if tvb:len() > 13 then
            t:add(fm.frag_data, tvb(13))
        end
        local summary = "fragment " .. tvb(5, 2):uint() .. "/" .. tvb(7, 2):uint()
        local whole, done_in = reassemble(tvb, pinfo)
        if done_in then
            t:add(fm.frag_reassembled, done_in)
        end
        if whole then
            local rt = whole:tvb("Reassembled management message")
            return summary .. ", reassembled: " .. (dissect_mgmt(rt, pinfo, tree, true) or "malformed")
        end
        return summary
    elseif (kind == 0xC0 or kind == 0xE0 or kind == 0xE1) and tvb:len() > 1 then
        return dissect_cdap(tvb(1):tvb(), pinfo, t)
    end
    -- No discriminator: a CDAP message handed to the daemon.
    return dissect_cdap(tvb, pinfo, t)
end

-- ------------------------------------------------------------------- EFCP

-- Where the PCI starts and ends in `tvb`, if it holds a plausible PDU:
-- returns (pci offset, pdu end) or nil.
local function efcp_bounds(tvb)
    local w = widths()
    local off = p_efcp.prefs.ttl and 1 or 0
    local tail = p_efcp.prefs.crc and 4 or 0
    local base = 1 + 2 * w.addr + w.qos + 2 * w.cep + 2 + w.length
    if tvb:len() < off + base + tail then
        return nil
    end
    if tvb(off, 1):uint() ~= 1 then
        return nil
    end
    local tpos = off + 1 + 2 * w.addr + w.qos + 2 * w.cep
    if not PDU_TYPES[tvb(tpos, 1):uint()] then
        return nil
    end
    local len = tvb(tpos + 2, w.length):uint64():tonumber()
    if len < base or off + len + tail > tvb:len() then
        return nil
    end
    return off, off + len
end

-- Bytes of a sealed frame's header (marker, key id u32, sequence u64) and
-- of its tag (crates/rina-core/src/sdup/aead.rs).
local SEALED_HEADER, TAG_LEN = 13, 16

-- "clear" or "sealed" if `tvb` starts with the marker of N-1 flow
-- encryption, which goes in front of TTL, PDU and CRC; nil otherwise.
local function aead_kind(tvb)
    local mode, n = p_efcp.prefs.aead, tvb:len()
    if mode == 3 or n < 2 or (mode == 1 and efcp_bounds(tvb)) then
        return nil
    end
    local m = tvb(0, 1):uint()
    if m == 0x00 and (mode == 2 or efcp_bounds(tvb(1):tvb())) then
        return "clear"
    elseif m == 0xAE and n >= SEALED_HEADER + TAG_LEN then
        return "sealed"
    end
    return nil
end

-- A sealed frame: its header and tag; the PDU inside needs the key.
local function dissect_sealed(tvb, pinfo, t)
    t:add(fe.aead, tvb(0, 1))
    t:add(fe.aead_key, tvb(1, 4))
    t:add(fe.aead_seq, tvb(5, 8))
    local body = tvb:len() - SEALED_HEADER - TAG_LEN
    if body > 0 then
        t:add(fe.aead_sealed, tvb(SEALED_HEADER, body))
    end
    t:add(fe.aead_tag, tvb(tvb:len() - TAG_LEN, TAG_LEN))
    local info = string.format("EFCP sealed frame, key 0x%08x, seq %s", tvb(1, 4):uint(),
        tostring(tvb(5, 8):uint64()))
    t:append_text(", " .. info)
    pinfo.cols.protocol = "RINA"
    pinfo.cols.info = info
end

-- Dissects a normal-DIF PDU (as carried in an N-1 SDU), behind the
-- marker of N-1 flow encryption if there is one.
function p_efcp.dissector(tvb, pinfo, tree)
    if tvb:len() == 0 then
        return 0
    end
    local w = widths()
    local t = tree:add(p_efcp, tvb())
    local kind = aead_kind(tvb)
    if kind == "sealed" then
        return dissect_sealed(tvb, pinfo, t)
    elseif kind == "clear" then
        t:add(fe.aead, tvb(0, 1))
        tvb = tvb(1):tvb()
    end
    if not efcp_bounds(tvb) then
        t:add_proto_expert_info(e_efcp, "version, type or length field does not fit the frame: " ..
            "the fields below are likely wrong (check the width, TTL and CRC preferences)")
    end
    local off = 0
    if p_efcp.prefs.ttl then
        t:add(fe.ttl, tvb(0, 1))
        off = 1
    end
    local pci_start = off
    if off + 1 > tvb:len() then
        return
    end
    t:add(fe.version, tvb(off, 1))
    off = off + 1
    local dst, src
    dst, off = add_uint(t, fe.dst_addr, tvb, off, w.addr)
    src, off = add_uint(t, fe.src_addr, tvb, off, w.addr)
    _, off = add_uint(t, fe.qos_id, tvb, off, w.qos)
    _, off = add_uint(t, fe.dst_cep, tvb, off, w.cep)
    _, off = add_uint(t, fe.src_cep, tvb, off, w.cep)
    if off + 2 > tvb:len() then
        return
    end
    local ptype = tvb(off, 1):uint()
    t:add(fe.pdu_type, tvb(off, 1))
    local ft = t:add(fe.flags, tvb(off + 1, 1))
    ft:add(fe.drf, tvb(off + 1, 1))
    ft:add(fe.ecn, tvb(off + 1, 1))
    off = off + 2
    local len
    len, off = add_uint(t, fe.length, tvb, off, w.length)
    if not len then
        return
    end
    local control = ptype ~= 0x80 and ptype ~= 0x40
    _, off = add_uint(t, control and fe.ctrl_seq or fe.seq, tvb, off, control and w.ctrl_seq or w.seq)
    local pdu_end = math.min(pci_start + len:tonumber(), tvb:len())
    local name = PDU_TYPES[ptype] or string.format("0x%02x", ptype)
    local info = string.format("EFCP %s %s -> %s", name, tostring(src), tostring(dst))
    if control then
        for _, f in ipairs(BODIES[ptype] or {}) do
            _, off = add_uint(t, fe[f[1]], tvb, off, w[f[2]])
        end
    elseif off < pdu_end then
        local payload = tvb(off, pdu_end - off):tvb()
        if ptype == 0x80 then
            t:add(fe.delimiter, payload(0, 1))
            if payload:len() > 1 then
                t:add(fe.user_data, payload(1))
            end
        else
            local s = dissect_mgmt(payload, pinfo, t)
            if s then
                info = info .. " " .. s
            end
        end
    end
    -- The CRC follows the PDU; link padding (of a short Ethernet frame)
    -- comes after it.
    local after = pdu_end
    if p_efcp.prefs.crc and after + 4 <= tvb:len() then
        t:add(fe.crc, tvb(after, 4))
        after = after + 4
    end
    if after < tvb:len() then
        t:add(fe.padding, tvb(after, tvb:len() - after))
    end
    t:append_text(", " .. info)
    pinfo.cols.protocol = "RINA"
    pinfo.cols.info = info
end

-- An N-1 SDU: an EFCP PDU if the preference (and for "auto", the
-- length field) says so, else opaque bytes.
local function dissect_sdu(tvb, pinfo, tree, field)
    local mode = p_udp.prefs.efcp
    if mode == 2 or (mode == 1 and (efcp_bounds(tvb) or aead_kind(tvb))) then
        p_efcp.dissector(tvb, pinfo, tree)
        return true
    end
    if tvb:len() > 0 then
        tree:add(field, tvb())
    end
    return false
end

-- --------------------------------------------------------------- shim-udp

-- True if `tvb` is shaped like a shim-udp datagram.
local function looks_like_shim_udp(tvb)
    local n = tvb:len()
    if n < 5 then
        return false
    end
    local t = tvb(0, 1):uint()
    if t == 1 then
        -- Port-ids are small: the top two bytes are zero.
        return tvb(1, 2):uint() == 0
    elseif t == 2 then
        local off = 1 + 4 + 29
        if n < off + 2 then return false end
        off = off + 2 + tvb(off, 2):uint()
        if n < off + 2 then return false end
        -- Optionally followed by a direct flow's UDP port.
        local e = off + 2 + tvb(off, 2):uint()
        return e == n or e + 2 == n
    elseif t == 3 then
        if n < 16 then return false end
        local e = 16 + tvb(14, 2):uint()
        return tvb(9, 1):uint() <= 4 and (e == n or e + 2 == n)
    elseif t == 4 then
        return n == 9
    elseif t == 5 then
        return n >= 10 and (n - 2) % 8 == 0 and tvb(1, 1):uint() <= 1
    end
    return false
end

function p_udp.dissector(tvb, pinfo, tree)
    if tvb:len() < 1 then
        return 0
    end
    pinfo.cols.protocol = "RINA shim-udp"
    local t = tree:add(p_udp, tvb())
    local ty = tvb(0, 1):uint()
    t:add(fu.type, tvb(0, 1))
    local kind = NAME_TYPES[ty] or "unknown"
    t:append_text(", " .. kind)
    local info = "shim-udp " .. kind
    if ty == 1 and tvb:len() >= 5 then
        t:add(fu.dst_port, tvb(1, 4))
        info = info .. " port " .. tvb(1, 4):uint()
        pinfo.cols.info = info
        if tvb:len() > 5 then
            dissect_sdu(tvb(5):tvb(), pinfo, tree, fu.sdu)
        end
        return tvb:len()
    elseif ty == 2 and tvb:len() >= 34 then
        t:add(fu.src_port, tvb(1, 4))
        add_qos(t, tvb, 5)
        local s, d, off
        s, off = add_str16(t, fu.src_name, tvb, 34)
        d, off = add_str16(t, fu.dst_name, tvb, off)
        info = info .. " " .. (s or "?") .. " -> " .. (d or "?")
        if d and off + 2 == tvb:len() then
            t:add(fu.direct, tvb(off, 2))
            info = info .. " (direct, port " .. tvb(off, 2):uint() .. ")"
        end
    elseif ty == 3 and tvb:len() >= 16 then
        t:add(fu.dst_port, tvb(1, 4))
        t:add(fu.src_port, tvb(5, 4))
        t:add(fu.result, tvb(9, 1))
        t:add(fu.max_sdu, tvb(10, 4))
        local r, off = add_str16(t, fu.reason, tvb, 14)
        info = info .. " " .. (ALLOC_RESULTS[tvb(9, 1):uint()] or "?")
        if r and off + 2 == tvb:len() then
            t:add(fu.direct, tvb(off, 2))
            info = info .. " (direct, port " .. tvb(off, 2):uint() .. ")"
        end
    elseif ty == 4 and tvb:len() >= 9 then
        t:add(fu.dst_port, tvb(1, 4))
        t:add(fu.src_port, tvb(5, 4))
        info = info .. " port " .. tvb(1, 4):uint()
    elseif ty == 5 and tvb:len() >= 10 then
        local probe = tvb(1, 1):uint() == 1
        t:add(fu.probe, tvb(1, 1))
        local n = math.floor((tvb:len() - 2) / 8)
        for k = 0, n - 1 do
            t:add(fu.dst_port, tvb(2 + 8 * k, 4))
            t:add(fu.src_port, tvb(6 + 8 * k, 4))
        end
        info = info .. (probe and " probe, " or " answer, ") .. n .. " flow(s)"
    end
    pinfo.cols.info = info
    return tvb:len()
end

local function heur_udp(tvb, pinfo, tree)
    if not p_udp.prefs.heuristic or not looks_like_shim_udp(tvb) then
        return false
    end
    p_udp.dissector(tvb, pinfo, tree)
    return true
end

p_udp:register_heuristic("udp", heur_udp)
DissectorTable.get("udp.port"):add_for_decode_as(p_udp)

-- --------------------------------------------------------------- shim-eth

function p_eth.dissector(tvb, pinfo, tree)
    pinfo.cols.protocol = "RINA shim-eth"
    local t = tree:add(p_eth, tvb())
    t:append_text(", SDU")
    pinfo.cols.info = "shim-eth SDU"
    dissect_sdu(tvb, pinfo, tree, fa.sdu)
end

-- Names are padded with NULs up to the protocol address length.
local function unpad(r)
    return (r:string():gsub("%z+$", ""))
end

local arp_original = DissectorTable.get("ethertype"):get_dissector(0x0806)

-- ARP of the shim DIF (protocol type 0xD1F0); any other ARP goes to
-- Wireshark's own dissector.
local p_arp = Proto("rina_shim_eth_arp", "RINA shim-eth ARP")
function p_arp.dissector(tvb, pinfo, tree)
    if tvb:len() < 8 or tvb(2, 2):uint() ~= 0xD1F0 then
        if arp_original then
            -- Wireshark's ARP dissector marks a malformed packet itself,
            -- then its exception comes back here as a Lua error: not ours.
            local ok, n = pcall(Dissector.call, arp_original, tvb, pinfo, tree)
            return ok and n or tvb:len()
        end
        return 0
    end
    local plen = tvb(5, 1):uint()
    local need = 8 + 2 * (6 + plen)
    pinfo.cols.protocol = "RINA ARP"
    local t = tree:add(p_eth, tvb(0, math.min(need, tvb:len())))
    t:append_text(", ARP")
    t:add(fa.htype, tvb(0, 2))
    t:add(fa.ptype, tvb(2, 2))
    t:add(fa.hlen, tvb(4, 1))
    t:add(fa.plen, tvb(5, 1))
    t:add(fa.op, tvb(6, 2))
    if tvb:len() < need or tvb(4, 1):uint() ~= 6 then
        pinfo.cols.info = "RINA ARP (malformed: truncated, or not Ethernet addresses)"
        return tvb:len()
    end
    local op = tvb(6, 2):uint()
    t:add(fa.sha, tvb(8, 6))
    local spa = unpad(tvb(14, plen))
    t:add(fa.spa, tvb(14, plen), spa)
    t:add(fa.tha, tvb(14 + plen, 6))
    local tpa = unpad(tvb(20 + plen, plen))
    t:add(fa.tpa, tvb(20 + plen, plen), tpa)
    if op == 1 then
        pinfo.cols.info = "Who has " .. tpa .. "? Tell " .. spa
    else
        pinfo.cols.info = spa .. " is at " .. tostring(tvb(8, 6):ether())
    end
    return tvb:len()
end

DissectorTable.get("ethertype"):add(0x0806, p_arp)
DissectorTable.get("ethertype"):add(0xD1F0, p_eth)

-- ------------------------------------------------------ rinactl capture

local p_n1 = Proto("rina_n1", "RINA N-1 frame (rinactl capture)")
local DIRECTIONS = { [0] = "received", [1] = "sent" }
local fn1 = {
    version = ProtoField.uint8("rina.n1.version", "Version"),
    direction = ProtoField.uint8("rina.n1.direction", "Direction", base.DEC, DIRECTIONS),
    port = ProtoField.uint32("rina.n1.port", "N-1 port-id"),
}
p_n1.fields = fn1

function p_n1.dissector(tvb, pinfo, tree)
    if tvb:len() < 8 then
        return 0
    end
    pinfo.cols.protocol = "RINA"
    local t = tree:add(p_n1, tvb(0, 8))
    t:add(fn1.version, tvb(0, 1))
    t:add(fn1.direction, tvb(1, 1))
    t:add(fn1.port, tvb(4, 4))
    local dir = DIRECTIONS[tvb(1, 1):uint()] or "?"
    t:append_text(string.format(", %s on N-1 port %d", dir, tvb(4, 4):uint()))
    if tvb:len() > 8 then
        p_efcp.dissector(tvb(8):tvb(), pinfo, tree)
    end
    return tvb:len()
end

DissectorTable.get("wtap_encap"):add(wtap_encaps and wtap_encaps.USER0 or wtap.USER0, p_n1)

-- --------------------------------------------------- rinactl capture (shim-hv)

local p_vmpi = Proto("rina_vmpi", "RINA shim-hv VMPI buffer (rinactl capture)")
local VMPI_CMDS = { [0] = "ALLOCATE_REQ", [1] = "ALLOCATE_RESP", [2] = "DEALLOCATE", [3] = "CREDIT" }
local VMPI_RESPONSES = { [0] = "ok", [1] = "refused" }
local fv = {
    version = ProtoField.uint8("rina.vmpi.version", "Version"),
    direction = ProtoField.uint8("rina.vmpi.direction", "Direction", base.DEC, DIRECTIONS),
    vmpi_id = ProtoField.uint32("rina.vmpi.vmpi_id", "VMPI-id"),
    channel = ProtoField.uint32("rina.vmpi.channel", "Channel"),
    cmd = ProtoField.uint8("rina.vmpi.cmd", "Control command", base.DEC, VMPI_CMDS),
    ctl_channel = ProtoField.uint32("rina.vmpi.ctl.channel", "Flow channel"),
    src_name = ProtoField.string("rina.vmpi.ctl.src_name", "Source application"),
    dst_name = ProtoField.string("rina.vmpi.ctl.dst_name", "Destination application"),
    response = ProtoField.uint8("rina.vmpi.ctl.response", "Response", base.DEC, VMPI_RESPONSES),
    reason = ProtoField.string("rina.vmpi.ctl.reason", "Reason"),
    window_sdus = ProtoField.uint32("rina.vmpi.ctl.window_sdus", "Credit window (SDUs; 0: no limit)"),
    window_bytes = ProtoField.uint32("rina.vmpi.ctl.window_bytes", "Credit window (bytes; 0: no limit)"),
    limit_sdus = ProtoField.uint64("rina.vmpi.ctl.limit_sdus", "Credit: SDU limit"),
    limit_bytes = ProtoField.uint64("rina.vmpi.ctl.limit_bytes", "Credit: byte limit"),
    sdu = ProtoField.bytes("rina.vmpi.sdu", "SDU"),
}
p_vmpi.fields = fv

-- A NUL-terminated name at `off`; returns it and the offset after the NUL,
-- or nil if there is no NUL.
local function add_cstr(tree, field, tvb, off)
    for i = off, tvb:len() - 1 do
        if tvb(i, 1):uint() == 0 then
            local s = i > off and tvb(off, i - off):string(ENC_UTF_8) or ""
            tree:add(field, tvb(off, i - off + 1), s)
            return s, i + 1
        end
    end
    return nil, off
end

-- The credit extension ("FC", window SDUs, window bytes) at `off`, if any.
local function add_credit_ext(t, tvb, off)
    if tvb:len() >= off + 10 and tvb(off, 2):string() == "FC" then
        t:add_le(fv.window_sdus, tvb(off + 2, 4))
        t:add_le(fv.window_bytes, tvb(off + 6, 4))
        return " (credit)"
    end
    return ""
end

-- A control message of channel 0; returns a summary.
local function dissect_vmpi_control(tvb, t)
    if not tvb or tvb:len() < 5 then
        return "control (truncated)"
    end
    local cmd = tvb(0, 1):uint()
    t:add(fv.cmd, tvb(0, 1))
    t:add_le(fv.ctl_channel, tvb(1, 4))
    local ch = tvb(1, 4):le_uint()
    local summary = (VMPI_CMDS[cmd] or ("command " .. cmd)) .. " channel " .. ch
    if cmd == 0 then
        local src, dst, off
        src, off = add_cstr(t, fv.src_name, tvb, 5)
        dst, off = add_cstr(t, fv.dst_name, tvb, off)
        summary = summary .. " " .. (src or "?") .. " -> " .. (dst or "?")
        if dst then
            summary = summary .. add_credit_ext(t, tvb, off)
        end
    elseif cmd == 1 and tvb:len() >= 6 then
        t:add(fv.response, tvb(5, 1))
        summary = summary .. " " .. (VMPI_RESPONSES[tvb(5, 1):uint()] or "?")
        if tvb:len() > 6 then
            -- The reason ends at a NUL, after which the credit extension may follow.
            local reason, off = add_cstr(t, fv.reason, tvb, 6)
            if reason then
                summary = summary .. add_credit_ext(t, tvb, off)
            else
                t:add(fv.reason, tvb(6), tvb(6):string(ENC_UTF_8))
            end
        end
    elseif cmd == 3 and tvb:len() >= 21 then
        t:add_le(fv.limit_sdus, tvb(5, 8))
        t:add_le(fv.limit_bytes, tvb(13, 8))
        summary = summary .. " until SDU " .. tostring(tvb(5, 8):le_uint64()) .. ", byte " .. tostring(tvb(13, 8):le_uint64())
    end
    return summary
end

function p_vmpi.dissector(tvb, pinfo, tree)
    if tvb:len() < 8 then
        return 0
    end
    pinfo.cols.protocol = "RINA shim-hv"
    local t = tree:add(p_vmpi, tvb())
    t:add(fv.version, tvb(0, 1))
    t:add(fv.direction, tvb(1, 1))
    t:add(fv.vmpi_id, tvb(4, 4))
    local dir = DIRECTIONS[tvb(1, 1):uint()] or "?"
    t:append_text(string.format(", %s on VMPI %d", dir, tvb(4, 4):uint()))
    if tvb:len() < 12 then
        pinfo.cols.info = "VMPI buffer (truncated)"
        return tvb:len()
    end
    t:add_le(fv.channel, tvb(8, 4))
    local ch = tvb(8, 4):le_uint()
    local info
    if ch == 0 then
        info = "VMPI " .. dissect_vmpi_control(tvb:len() > 12 and tvb(12):tvb() or nil, t)
    else
        info = "VMPI channel " .. ch
        pinfo.cols.info = info
        if tvb:len() > 12 and dissect_sdu(tvb(12):tvb(), pinfo, tree, fv.sdu) then
            return tvb:len()
        end
    end
    pinfo.cols.info = info
    return tvb:len()
end

DissectorTable.get("wtap_encap"):add(wtap_encaps and wtap_encaps.USER1 or wtap.USER1, p_vmpi)
