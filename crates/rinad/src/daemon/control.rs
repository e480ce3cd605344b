//! The control socket: connections from applications and tools, their
//! requests (register, allocate, accept, list, ...) and the replies.

use super::*;

/// Encoded bytes of one page of a listing: far below the 1 MiB message
/// limit, and below the default socket send buffer (`net.core.wmem_max`).
const PAGE_BYTES: usize = 64 << 10;

/// Makes sure the directory of the control socket at `path` is safe to
/// hold it: the default per-user directory (`/tmp/rinad-<uid>`) is created
/// private and must be this user's own; any other must be owned by this
/// user or root and not writable by every user (unless sticky, like `/tmp`).
pub(super) fn prepare_socket(path: &std::path::Path) -> Result<(), DaemonError> {
    let private = path.parent() == Some(ctl::private_socket_dir(sys::euid()).as_path());
    sys::prepare_socket_dir(path, private).map_err(|m| DaemonError::Io {
        what: format!("control socket {}", path.display()),
        source: io::Error::new(io::ErrorKind::PermissionDenied, m),
    })
}

impl Daemon {
    // ---- control connections ---------------------------------------------

    pub(super) fn accept_conns(&mut self) {
        for _ in 0..ACCEPTS_PER_TURN {
            match sys::accept(&self.listener) {
                Ok(Some(fd)) => {
                    let Ok(cred) = sys::peer_cred(&fd) else {
                        warn!("cannot tell who connected; closing the connection");
                        continue;
                    };
                    let admin = self.access.is_admin(&cred);
                    let refused = if self.conns.len() >= MAX_CONNS {
                        Err(access::Refusal::Full { limit: MAX_CONNS })
                    } else {
                        self.admit(&cred, admin)
                    };
                    if let Err(r) = refused {
                        let e = r.error();
                        warn!(uid = cred.uid, pid = cred.pid, reason = %e, "control connection refused");
                        // Read what it sent already: closing a socket with
                        // unread data resets the peer, which loses the reason.
                        let mut scratch = [0u8; 16];
                        for _ in 0..BUDGET {
                            if !matches!(
                                sys::recv(fd.as_raw_fd(), &mut scratch),
                                Ok(Recv::Packet(_) | Recv::Empty)
                            ) {
                                break;
                            }
                        }
                        let msg = Message::Reply {
                            id: 0,
                            result: Err(e),
                        };
                        let _ = sys::send(fd.as_raw_fd(), &ctl::encode(&msg), None);
                        continue;
                    }
                    let id = self.next_conn;
                    self.next_conn += 1;
                    if self
                        .poll
                        .registry()
                        .register(
                            &mut SourceFd(&fd.as_raw_fd()),
                            token(T_CONN, id),
                            Interest::READABLE,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    debug!(
                        conn = id,
                        uid = cred.uid,
                        pid = cred.pid,
                        admin,
                        "client connected"
                    );
                    let last_seen = self.now();
                    self.conns.insert(
                        id,
                        Conn {
                            fd,
                            out: VecDeque::new(),
                            out_bytes: 0,
                            replies: 0,
                            reply_bytes: 0,
                            names: Vec::new(),
                            cred,
                            admin,
                            last_seen,
                            flows: 0,
                        },
                    );
                }
                Ok(None) => return,
                Err(e) => {
                    // Typically out of descriptors: the pending connections
                    // stay queued; try again shortly (readiness is edge-triggered).
                    warn!(error = %e, "accept failed; retrying shortly");
                    self.accept_retry = Some(self.now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
        // More may wait (readiness is edge-triggered): the next turn goes
        // on, after the flows and clients already connected had theirs.
        self.accept_retry = Some(self.now());
    }

    pub(super) fn read_conn(&mut self, id: usize) {
        for _ in 0..BUDGET {
            let now = self.now();
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            // Back-pressure: a client that does not read its answers is not
            // read either; flush_conn reads again once they went out.
            if conn.backlogged() {
                return;
            }
            conn.last_seen = now;
            let fd = conn.fd.as_raw_fd();
            let mut buf = std::mem::take(&mut self.ctl_buf);
            let got = sys::recv(fd, &mut buf);
            let decoded = match &got {
                Ok(Recv::Packet(n)) if *n <= buf.len() => Some(ctl::decode::<Request>(&buf[..*n])),
                _ => None,
            };
            let cap = buf.len();
            self.ctl_buf = buf;
            match got {
                Ok(Recv::Packet(n)) if n > cap => {
                    let e = CtlError::new(
                        ErrorKind::InvalidRequest,
                        format!("control message of {n} bytes exceeds {}", ctl::MAX_CTL_MSG),
                    );
                    self.reply(id, 0, Err(e), None);
                }
                Ok(Recv::Packet(_)) => match decoded {
                    Some(Ok(req)) => self.on_request(id, req),
                    Some(Err(e)) => {
                        let e = CtlError::new(
                            ErrorKind::InvalidRequest,
                            format!("malformed request: {e}"),
                        );
                        self.reply(id, 0, Err(e), None);
                    }
                    None => {}
                },
                Ok(Recv::Empty) => {
                    let e = CtlError::new(ErrorKind::InvalidRequest, "empty control message");
                    self.reply(id, 0, Err(e), None);
                }
                Ok(Recv::WouldBlock) => return,
                Ok(Recv::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        // More may be waiting; edge-triggered readiness will not say so again.
        self.read_conn_later(id);
    }

    pub(super) fn read_conn_later(&mut self, id: usize) {
        if let Some(conn) = self.conns.get(&id) {
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&conn.fd.as_raw_fd()),
                token(T_CONN, id),
                Interest::READABLE | Interest::WRITABLE,
            );
        }
    }

    pub(super) fn close_conn(&mut self, id: usize) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&conn.fd.as_raw_fd()));
        for (i, name) in conn.names {
            self.sys.unregister_at(i, &name);
            self.owners.remove(&(i, name.clone()));
            info!(%name, ipcp = %self.ipcps[i].name, "unregistered (client gone)");
        }
        let theirs: Vec<u64> = self
            .incoming
            .iter()
            .filter(|(_, inc)| inc.conn == id)
            .map(|(h, _)| *h)
            .collect();
        let now = self.now();
        for h in theirs {
            if self.incoming.remove(&h).is_some() {
                let _ = self.sys.refuse(now, h, "the application went away");
            }
        }
        self.close_empty_bundles_of(id);
        debug!(conn = id, "client disconnected");
    }

    pub(super) fn reply(
        &mut self,
        conn: usize,
        id: u64,
        result: Result<Reply, CtlError>,
        fd: Option<OwnedFd>,
    ) {
        self.send_msg(
            conn,
            &Message::Reply { id, result },
            fd.into_iter().collect(),
        );
    }

    pub(super) fn send_msg(&mut self, id: usize, msg: &Message, fds: Vec<OwnedFd>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut bytes = ctl::encode(msg);
        let answer = !msg.is_news();
        if conn.out.is_empty() {
            let raw: Vec<std::os::fd::RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
            match sys::send_fds(conn.fd.as_raw_fd(), &bytes, &raw) {
                Ok(Sent::Done) => return,
                Ok(Sent::WouldBlock) => {}
                Ok(Sent::TooBig) => {
                    bytes = too_big(msg, bytes.len());
                    if matches!(sys::send(conn.fd.as_raw_fd(), &bytes, None), Ok(Sent::Done)) {
                        return;
                    }
                }
                Ok(Sent::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        if conn.out.len() >= CONN_QUEUE_MAX || conn.out_bytes + bytes.len() > CONN_QUEUE_BYTES {
            warn!(conn = id, "client does not read its replies; disconnecting");
            self.closing.push(id);
            return;
        }
        conn.out_bytes += bytes.len();
        if answer {
            conn.replies += 1;
            conn.reply_bytes += bytes.len();
        }
        conn.out.push_back((bytes, fds, answer));
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.fd.as_raw_fd()),
            token(T_CONN, id),
            Interest::READABLE | Interest::WRITABLE,
        );
    }

    pub(super) fn flush_conn(&mut self, id: usize) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let was_backlogged = conn.backlogged();
        while let Some((bytes, fds, answer)) = conn.out.front() {
            let raw: Vec<std::os::fd::RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
            match sys::send_fds(conn.fd.as_raw_fd(), bytes, &raw) {
                Ok(Sent::Done) => {
                    conn.out_bytes -= bytes.len();
                    if *answer {
                        conn.replies -= 1;
                        conn.reply_bytes -= bytes.len();
                    }
                    conn.out.pop_front();
                }
                Ok(Sent::TooBig) => {
                    let n = bytes.len();
                    // The queued bytes are our own encoding: decoding gives the id back.
                    let err = match ctl::decode::<Message>(bytes) {
                        Ok(msg) => too_big(&msg, n),
                        Err(_) => Vec::new(),
                    };
                    conn.out_bytes = conn.out_bytes - n + err.len();
                    if *answer {
                        conn.reply_bytes = conn.reply_bytes - n + err.len();
                    }
                    if let Some(front) = conn.out.front_mut() {
                        *front = (err, Vec::new(), front.2);
                    }
                }
                Ok(Sent::WouldBlock) => {
                    // Answers went out: the requests left unread are read.
                    if was_backlogged && !conn.backlogged() {
                        self.read_conn(id);
                    }
                    return;
                }
                Ok(Sent::Closed) | Err(_) => {
                    self.closing.push(id);
                    return;
                }
            }
        }
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&conn.fd.as_raw_fd()),
            token(T_CONN, id),
            Interest::READABLE,
        );
        // A read may have been deferred by the budget.
        self.read_conn(id);
    }

    pub(super) fn on_request(&mut self, conn: usize, req: Request) {
        let id = req.id;
        let result = match req.op {
            Op::Register { name, dif, accept } => self.register(conn, name, dif, accept),
            Op::Unregister { name, dif } => self.unregister(conn, &name, dif),
            Op::Allocate {
                local,
                remote,
                dif,
                qos,
                rings,
                direct,
                bundle,
            } => {
                let pa = PendingAlloc {
                    ipcp: 0,
                    conn,
                    uid: self.conn_uid(conn),
                    id,
                    local,
                    remote,
                    qos,
                    rings,
                    direct: direct && bundle.is_none(),
                    direct_sock: None,
                    bundle,
                };
                match self.allocate(pa, dif) {
                    Ok(()) => return,
                    Err(e) => Err(e),
                }
            }
            Op::Accept {
                handle,
                rings,
                direct,
                bundle,
            } => {
                match self.accept_incoming(conn, handle, rings, direct, bundle) {
                    Ok((info, fds)) => {
                        let msg = Message::Reply {
                            id,
                            result: Ok(Reply::Flow(info)),
                        };
                        self.send_msg(conn, &msg, fds)
                    }
                    Err(e) => self.reply(conn, id, Err(e), None),
                }
                return;
            }
            Op::Capture { ipcp, snaplen } => {
                let started = self
                    .require_admin(conn, "capturing an IPCP's traffic")
                    .and_then(|()| self.start_capture(&ipcp, snaplen));
                match started {
                    Ok((reply, fd)) => self.reply(conn, id, Ok(reply), Some(fd)),
                    Err(e) => self.reply(conn, id, Err(e), None),
                }
                return;
            }
            Op::OpenBundle => {
                match self.open_bundle(conn) {
                    Ok((reply, fd)) => self.reply(conn, id, Ok(reply), Some(fd)),
                    Err(e) => self.reply(conn, id, Err(e), None),
                }
                return;
            }
            Op::Refuse { handle, reason } => self.refuse_incoming(conn, handle, &reason),
            Op::Deallocate { port } => self.deallocate(conn, port),
            Op::ListIpcps => Ok(Reply::Ipcps {
                ipcps: self.list_ipcps(conn),
            }),
            Op::ListDifs => Ok(Reply::Difs {
                difs: self.list_difs(),
            }),
            Op::ListNames { skip } => Ok(self.list_names(conn, skip.unwrap_or(0))),
            Op::ListFlows { after } => Ok(self.list_flows(conn, after.unwrap_or(0))),
            Op::FlowBySocket { dev, ino } => self.flow_by_socket(conn, (dev, ino)),
            Op::ReadRib {
                ipcp,
                path,
                depth,
                remote: Some(neighbor),
            } => {
                let started = self
                    .require_admin(conn, "reading a RIB")
                    .and_then(|()| self.read_remote_rib(&ipcp, &neighbor, path.as_deref(), depth));
                match started {
                    Ok(key) => {
                        self.rib_reads.insert(key, (conn, id));
                        return;
                    }
                    Err(e) => Err(e),
                }
            }
            Op::ReadRib {
                ipcp, path, depth, ..
            } => self
                .require_admin(conn, "reading a RIB")
                .and_then(|()| self.read_rib(&ipcp, path.as_deref(), depth)),
            Op::Scheduler { ipcp, set } => match set {
                Some(_) => self.require_admin(conn, "changing a scheduling policy"),
                None => Ok(()),
            }
            .and_then(|()| self.scheduler(&ipcp, set)),
            op @ (Op::CreateIpcp { .. }
            | Op::DestroyIpcp { .. }
            | Op::Enroll { .. }
            | Op::SetEfcp { .. }
            | Op::Reload { .. }) => match self.runtime_op(conn, id, op) {
                Some(r) => r,
                None => return,
            },
            op @ (Op::AddNeighbor { .. }
            | Op::RemoveNeighbor { .. }
            | Op::RegisterIpcp { .. }
            | Op::UnregisterIpcp { .. }) => self.manage(conn, op),
        };
        self.reply(conn, id, result, None);
    }

    /// IPCPs in `dif`, or every IPCP without one.
    pub(super) fn ipcps_in(&self, dif: Option<&str>) -> Result<Vec<usize>, CtlError> {
        if self.live_ipcps().next().is_none() {
            return Err(CtlError::new(
                ErrorKind::NoDif,
                format!("system {} has no IPC process", self.system),
            ));
        }
        match dif {
            None => Ok(self.live_ipcps().collect()),
            Some(d) => {
                let v: Vec<usize> = self
                    .live_ipcps()
                    .filter(|&i| self.ipcps[i].dif == d)
                    .collect();
                if v.is_empty() {
                    let known: Vec<&str> = self
                        .live_ipcps()
                        .map(|i| self.ipcps[i].dif.as_str())
                        .collect();
                    return Err(CtlError::new(
                        ErrorKind::UnknownDif,
                        format!("no DIF named {d:?}; this system has {}", known.join(", ")),
                    ));
                }
                Ok(v)
            }
        }
    }

    pub(super) fn register(
        &mut self,
        conn: usize,
        name: AppName,
        dif: Option<String>,
        accept: Option<AutoAccept>,
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
        self.check_ipcp_name(conn, &name, "register")?;
        if let Some(b) = accept.and_then(|a| a.bundle) {
            self.check_bundle_owner(conn, b)?;
        }
        let held = self.conns.get(&conn).map_or(0, |c| c.names.len());
        if held + targets.len() > MAX_NAMES_PER_CONN {
            return Err(CtlError::new(
                ErrorKind::NoResources,
                format!("a client may hold at most {MAX_NAMES_PER_CONN} registrations"),
            ));
        }
        if let Some(&i) = targets
            .iter()
            .find(|&&i| self.owners.contains_key(&(i, name.clone())))
        {
            return Err(CtlError::new(
                ErrorKind::NameInUse,
                format!("{name} is already registered in DIF {}", self.ipcps[i].dif),
            ));
        }
        // All or nothing: a DIF that refuses the name (its access rules,
        // an IPCP's name) takes back the registrations made before it.
        for (k, &i) in targets.iter().enumerate() {
            if let Err(e) = self.sys.register_at(i, name.clone()) {
                for &j in &targets[..k] {
                    self.sys.unregister_at(j, &name);
                }
                return Err(ipcp::flow_error(e));
            }
        }
        let mut difs = Vec::new();
        for i in targets {
            self.owners
                .insert((i, name.clone()), Owner { conn, accept });
            if let Some(c) = self.conns.get_mut(&conn) {
                c.names.push((i, name.clone()));
            }
            info!(%name, ipcp = %self.ipcps[i].name, accepting = accept.is_some(), "registered");
            difs.push(self.ipcps[i].dif.clone());
        }
        Ok(Reply::Registered { difs })
    }

    /// Deallocates flow `port` for `conn`: its own flow, one of its user's,
    /// or any flow for an administrator.
    pub(super) fn deallocate(&mut self, conn: usize, port: u32) -> Result<Reply, CtlError> {
        let Some(slot) = self.flows.get(&port) else {
            return Err(CtlError::new(
                ErrorKind::UnknownFlow,
                format!("no flow with port-id {port}"),
            ));
        };
        if slot.owner != conn && !self.may_touch(conn, slot.uid) {
            return Err(CtlError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "flow {port} belongs to another user (uid {}): only that user or an administrator may deallocate it",
                    slot.uid
                ),
            ));
        }
        self.close_flow(port, true);
        Ok(Reply::Done)
    }

    /// Refuses to let `conn` allocate flows from a name another user has
    /// registered on this system (it would pose as that application);
    /// administrators may.
    fn check_local_name(&self, conn: usize, local: &AppName) -> Result<(), CtlError> {
        self.check_ipcp_name(conn, local, "allocate flows from")?;
        for i in 0..self.ipcps.len() {
            let Some(&Owner { conn: holder, .. }) = self.owners.get(&(i, local.clone())) else {
                continue;
            };
            let uid = self.conn_uid(holder);
            if holder != conn && !self.may_touch(conn, uid) {
                return Err(CtlError::new(
                    ErrorKind::PermissionDenied,
                    format!("{local} is registered by another user (uid {uid}): only that user or an administrator may allocate flows from it"),
                ));
            }
        }
        Ok(())
    }

    /// Refuses to let `conn` `what` (register, allocate flows from) the
    /// name of one of this system's IPCPs unless it is an administrator's:
    /// the name is the system's, and peers in the DIFs below take what
    /// comes in it for that IPCP (N-1 flows, enrollment). An IPCP named
    /// with an instance (`a.net/1`) holds its whole process name.
    fn check_ipcp_name(&self, conn: usize, name: &AppName, what: &str) -> Result<(), CtlError> {
        let taken = self.live_ipcps().any(|i| {
            let ipcp = &self.ipcps[i].name;
            ipcp.parse::<AppName>()
                .map_or(*ipcp == name.process_name, |n| {
                    n.process_name == name.process_name
                })
        });
        if taken && !self.conn_admin(conn) {
            return Err(CtlError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} is the name of an IPC process of this system: only an administrator may {what} it",
                    name.process_name
                ),
            ));
        }
        Ok(())
    }

    /// Withdraws `name` (from `dif`, or every DIF) for `conn`: a
    /// registration of its own user's, or any for an administrator.
    pub(super) fn unregister(
        &mut self,
        conn: usize,
        name: &AppName,
        dif: Option<String>,
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
        let mut found = false;
        let mut denied = None;
        for i in targets {
            let key = (i, name.clone());
            let Some(&Owner { conn: holder, .. }) = self.owners.get(&key) else {
                continue;
            };
            let holder_uid = self.conn_uid(holder);
            if holder != conn && !self.may_touch(conn, holder_uid) {
                denied = Some(holder_uid);
                continue;
            }
            self.owners.remove(&key);
            self.sys.unregister_at(i, name);
            if let Some(c) = self.conns.get_mut(&holder) {
                c.names.retain(|(j, n)| !(*j == i && n == name));
            }
            if holder != conn {
                // The application that registered it hears of it.
                let msg = Message::Unregistered {
                    name: name.clone(),
                    dif: self.ipcps[i].dif.clone(),
                };
                self.send_msg(holder, &msg, Vec::new());
            }
            info!(%name, ipcp = %self.ipcps[i].name, "unregistered");
            found = true;
        }
        match (found, denied) {
            (true, _) => Ok(Reply::Done),
            (false, Some(uid)) => Err(CtlError::new(
                ErrorKind::PermissionDenied,
                format!("{name} is registered by another user (uid {uid}): only that user or an administrator may unregister it"),
            )),
            (false, None) => Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!("{name} is not registered by an application"),
            )),
        }
    }

    /// Starts allocation `pa` in `dif` (or, with none named, the DIF the
    /// core chooses: [`System::member_for`]); the reply follows when the
    /// IPCP answers.
    pub(super) fn allocate(
        &mut self,
        mut pa: PendingAlloc,
        dif: Option<String>,
    ) -> Result<(), CtlError> {
        check_qos(&pa.qos)?;
        self.check_local_name(pa.conn, &pa.local)?;
        self.may_open_flow(pa.conn).map_err(|r| r.error())?;
        let remote = pa.remote.clone();
        let candidates = self.ipcps_in(dif.as_deref())?;
        let knows = |&i: &usize| self.sys.member(i).is_some_and(|m| m.knows(&remote));
        // No DIF named: the core's choice (normal DIFs before shims).
        let i = match &dif {
            Some(_) => candidates.iter().copied().find(knows),
            None => self.sys.member_for(&remote),
        }
        .ok_or_else(|| {
            CtlError::new(
                ErrorKind::NameNotFound,
                match &dif {
                    Some(d) => format!("{remote} is not known in DIF {d}"),
                    None => format!("no DIF of system {} knows {remote}", self.system),
                },
            )
        })?;
        if let Some(b) = pa.bundle {
            self.check_bundle(pa.conn, b, i)?;
        }
        let now = self.now();
        let sock = if pa.direct {
            self.direct_socket(i)
        } else {
            None
        };
        let offer = sock
            .as_ref()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.port());
        let port = self
            .sys
            .allocate_at_direct(now, i, pa.local.clone(), remote.clone(), pa.qos, offer)
            .map_err(ipcp::flow_error)?;
        pa.direct_sock = sock;
        info!(port, local = %pa.local, %remote, ipcp = %self.ipcps[i].name, "allocating");
        pa.ipcp = i;
        self.access.charge(pa.uid);
        self.allocs.insert(port, pa);
        Ok(())
    }

    pub(super) fn accept_incoming(
        &mut self,
        conn: usize,
        handle: u64,
        rings: bool,
        direct: bool,
        bundle: Option<u32>,
    ) -> Result<(FlowInfo, Vec<OwnedFd>), CtlError> {
        // Where the requester's socket is, if it offered a direct flow.
        let offered = self.sys.offered_direct(handle);
        let inc = self.take_incoming(conn, handle)?;
        let refuse = |d: &mut Self, e: CtlError| {
            let now = d.now();
            let _ = d.sys.refuse(now, handle, &e.message);
            e
        };
        // The user's share first: over it the flow is refused, with the reason.
        if let Err(r) = self.may_open_flow(conn) {
            return Err(refuse(self, r.error()));
        }
        // The descriptors (or the bundle) next: without them the flow is
        // refused, with the reason, instead of accepted and then closed at
        // once.
        let pair = match bundle {
            Some(b) => match self.check_bundle(conn, b, inc.ipcp) {
                Ok(()) => None,
                Err(e) => return Err(refuse(self, e)),
            },
            None => match new_flow_pair(&self.system) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.warn_no_descriptor("refusing a flow", &e);
                    return Err(refuse(self, e));
                }
            },
        };
        let sock = match offered {
            Some(peer) if direct && pair.is_some() => self
                .direct_socket(inc.ipcp)
                .and_then(|s| Self::connect_direct(s, peer)),
            _ => None,
        };
        let offer = sock
            .as_ref()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.port());
        let now = self.now();
        let (port, max_sdu) = self
            .sys
            .accept_direct(now, handle, offer)
            .map_err(ipcp::flow_error)?;
        let info = FlowInfo {
            port,
            dif: self.ipcps[inc.ipcp].dif.clone(),
            local: inc.local,
            remote: inc.remote,
            qos: inc.qos,
            max_sdu,
            direct: false,
            bundle: None,
        };
        let direct = sock.filter(|_| self.sys.direct_peer(port).is_some());
        let opened = match (pair, direct) {
            (None, _) => self
                .open_bundled_flow(inc.ipcp, conn, info, bundle.unwrap_or(0))
                .map(|info| (info, Vec::new())),
            (Some(pair), Some(s)) => self.open_direct_flow(inc.ipcp, conn, info, s, pair),
            (Some(pair), None) => self
                .open_flow_with(inc.ipcp, conn, info, rings, pair)
                .map(|(info, fd)| (info, vec![fd])),
        };
        match opened {
            Ok((info, fds)) => {
                info!(port, local = %info.local, remote = %info.remote, direct = info.direct, "flow accepted");
                Ok((info, fds))
            }
            Err(e) => {
                self.sys.close(now, port);
                Err(e)
            }
        }
    }

    /// Accepts request `handle` for `conn`, whose registration asked the
    /// daemon to, and hands the flow over as news; a refusal (the user's
    /// share, no descriptors) is sent to the requester by
    /// [`Daemon::accept_incoming`], and logged here.
    pub(super) fn accept_for(&mut self, conn: usize, handle: u64, a: AutoAccept) {
        match self.accept_incoming(conn, handle, a.rings, a.direct, a.bundle) {
            Ok((flow, fds)) => {
                let msg = Message::FlowAccepted {
                    flow,
                    rings: a.rings && a.bundle.is_none(),
                };
                self.send_msg(conn, &msg, fds)
            }
            Err(e) => {
                info!(handle, error = %e, "flow request refused for its accepting application")
            }
        }
    }

    pub(super) fn refuse_incoming(
        &mut self,
        conn: usize,
        handle: u64,
        reason: &str,
    ) -> Result<Reply, CtlError> {
        self.take_incoming(conn, handle)?;
        let now = self.now();
        self.sys
            .refuse(now, handle, reason)
            .map_err(ipcp::flow_error)?;
        Ok(Reply::Done)
    }

    pub(super) fn take_incoming(&mut self, conn: usize, handle: u64) -> Result<Incoming, CtlError> {
        match self.incoming.get(&handle) {
            Some(inc) if inc.conn == conn => Ok(self.incoming.remove(&handle).expect("present")),
            _ => Err(CtlError::new(
                ErrorKind::RequestGone,
                format!("no pending flow request {handle} for this client (answered, withdrawn or timed out)"),
            )),
        }
    }

    /// Reads, and with `set` first replaces, the RMT scheduling policy of
    /// normal IPCP `ipcp`.
    pub(super) fn scheduler(
        &mut self,
        ipcp: &str,
        set: Option<serde_json::Value>,
    ) -> Result<Reply, CtlError> {
        use rina_core::rmt::SchedulerConfig;
        use rina_wire::ctl::{PortQueues, QueueCounters, SchedulerInfo};
        let j = self.live_named(ipcp)?;
        let kind = self.kind(j);
        let not_normal = || {
            CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "IPCP {ipcp} is a {kind} IPCP; only normal IPCPs have an RMT scheduling policy"
                ),
            )
        };
        let Io::Normal(nio) = &mut self.ipcps[j].io else {
            return Err(not_normal());
        };
        let Some(n) = self.sys.member_mut(j).and_then(|m| m.normal_mut()) else {
            return Err(not_normal());
        };
        if let Some(v) = set {
            let bad = |m: String| CtlError::new(ErrorKind::InvalidRequest, m);
            crate::config::check_sched_bounds(&v)
                .map_err(|e| bad(format!("bad scheduling policy: {e}")))?;
            let cfg: SchedulerConfig = serde_json::from_value(v)
                .map_err(|e| bad(format!("bad scheduling policy: {e}")))?;
            let cu = rina_core::normal::cubes::cu_map(&n.config().cubes);
            let sched = cfg.build(&cu).map_err(|e| bad(e.to_string()))?;
            n.rmt_mut().set_scheduler(sched);
            info!(ipcp, policy = cfg.name(), "RMT scheduling policy changed");
            nio.sched = cfg;
        }
        let config = serde_json::to_value(&nio.sched).unwrap_or_default();
        let n = self
            .sys
            .member(j)
            .and_then(|m| m.normal())
            .ok_or_else(not_normal)?;
        let neighbors = self.sys.plan(j).map_or(&[][..], |p| &p.neighbors[..]);
        let rmt = n.rmt();
        let ports = rmt
            .ports()
            .map(|port| PortQueues {
                port,
                neighbor: neighbors
                    .iter()
                    .find(|nb| nb.port == Some(port))
                    .map(|nb| nb.spec.name.to_string()),
                queues: rmt
                    .queue_stats(port)
                    .into_iter()
                    .map(|q| QueueCounters {
                        queue: q.queue,
                        queued: q.queued as u64,
                        sent: q.sent,
                        dropped: q.dropped,
                        max_occupancy: q.max_occupancy as u64,
                    })
                    .collect(),
            })
            .collect();
        Ok(Reply::Scheduler(SchedulerInfo {
            ipcp: ipcp.to_string(),
            policy: rmt.scheduler_name().to_string(),
            config,
            ports,
        }))
    }

    // ---- listings ----------------------------------------------------------

    /// Starts reading the RIB of `neighbor`, a neighbour of normal IPCP
    /// `ipcp`, over the DIF (CDAP `M_READ`); the reply goes out when the
    /// IPCP reports the outcome. Returns (IPCP index, handle).
    pub(super) fn read_remote_rib(
        &mut self,
        ipcp: &str,
        neighbor: &str,
        path: Option<&str>,
        depth: Option<u32>,
    ) -> Result<(usize, u64), CtlError> {
        let now = self.now();
        let bad = |m: String| CtlError::new(ErrorKind::InvalidRequest, m);
        let i = self.live_named(ipcp)?;
        let not_normal = || bad(format!("{ipcp} is not a normal IPCP: it has no DIF peers"));
        let started = self.sys.with_machine(now, i, |m| match m {
            Machine::Normal(n) => Some(
                n.read_remote_rib(now, neighbor, path.unwrap_or("/"), depth)
                    .map_err(|e| e.to_string()),
            ),
            _ => None,
        });
        let handle = started.flatten().ok_or_else(not_normal)?.map_err(bad)?;
        Ok((i, handle))
    }

    pub(super) fn read_rib(
        &self,
        ipcp: &str,
        path: Option<&str>,
        depth: Option<u32>,
    ) -> Result<Reply, CtlError> {
        let i = self.live_named(ipcp)?;
        let rib = self.ipcp_rib(i);
        let depth = depth.map_or(rina_core::rib::ALL_LEVELS, |d| d as usize);
        let entries = rib
            .snapshot(path.unwrap_or("/"), depth)
            .map_err(|e| CtlError::new(ErrorKind::InvalidRequest, e.to_string()))?;
        Ok(Reply::Rib {
            objects: entries
                .into_iter()
                .map(|e| RibObjectInfo {
                    name: e.name,
                    class: e.class,
                    instance: e.instance,
                    value: e.value_summary,
                    owner: e.owner,
                })
                .collect(),
        })
    }

    /// The IPCPs; a client that is not an administrator sees only its
    /// own user's names in them.
    pub(super) fn list_ipcps(&self, conn: usize) -> Vec<IpcpInfo> {
        self.ipcps
            .iter()
            .enumerate()
            .filter(|(_, ip)| !matches!(ip.io, Io::Removed))
            .map(|(i, ip)| {
                let (names, names_more) = self.ipcp_names(conn, i);
                IpcpInfo {
                    name: ip.name.clone(),
                    kind: self.kind(i).into(),
                    dif: ip.dif.clone(),
                    address: self.address(i),
                    flows: self.flow_count(i),
                    names,
                    names_more,
                    counters: self.counters(i),
                }
            })
            .collect()
    }

    /// The names of IPCP `i` that `conn` may see, as many as an
    /// [`IpcpInfo`] lists ([`ctl::IPCP_NAMES_LISTED`], within
    /// [`ctl::IPCP_NAME_BYTES`]), and how many more there are.
    fn ipcp_names(&self, conn: usize, i: usize) -> (Vec<AppName>, u64) {
        let mut listed = Vec::new();
        let mut bytes = 0;
        let mut more = 0u64;
        for n in self.sys.names(i) {
            if !self.may_see_name(conn, i, &n) {
                continue;
            }
            // Quoted, and a comma.
            let len = ctl::encode(&n).len() + 1;
            if more == 0
                && listed.len() < ctl::IPCP_NAMES_LISTED
                && bytes + len <= ctl::IPCP_NAME_BYTES
            {
                bytes += len;
                listed.push(n);
            } else {
                more += 1;
            }
        }
        (listed, more)
    }

    /// Whether `conn` may see name `n` registered in IPCP `i`: an
    /// administrator sees every name, anyone else the names of their user.
    fn may_see_name(&self, conn: usize, i: usize, n: &AppName) -> bool {
        if self.conn_admin(conn) {
            return true;
        }
        match self.owners.get(&(i, n.clone())) {
            Some(o) => self.conn_uid(o.conn) == self.conn_uid(conn),
            None => false,
        }
    }

    pub(super) fn list_difs(&self) -> Vec<DifInfo> {
        let mut difs: BTreeMap<&str, (&'static str, Vec<String>)> = BTreeMap::new();
        for (i, ip) in self.ipcps.iter().enumerate() {
            if matches!(ip.io, Io::Removed) {
                continue;
            }
            let e = difs.entry(&ip.dif).or_insert((self.kind(i), Vec::new()));
            e.1.push(ip.name.clone());
        }
        difs.into_iter()
            .map(|(name, (kind, ipcps))| DifInfo {
                name: name.to_string(),
                kind: kind.into(),
                ipcps,
            })
            .collect()
    }

    /// One page of the names `conn` may see, after the first `skip` of them.
    pub(super) fn list_names(&self, conn: usize, skip: u64) -> Reply {
        let all = self.ipcps.iter().enumerate().flat_map(|(i, ip)| {
            self.sys
                .names(i)
                .into_iter()
                .filter(move |n| self.may_see_name(conn, i, n))
                .map(move |name| NameInfo {
                    accepts: self
                        .owners
                        .get(&(i, name.clone()))
                        .is_some_and(|o| o.accept.is_some()),
                    name,
                    dif: ip.dif.clone(),
                    ipcp: ip.name.clone(),
                })
        });
        let mut names = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        for (k, n) in all.enumerate().skip(skip.try_into().unwrap_or(usize::MAX)) {
            bytes += ctl::encode(&n).len() + 1;
            if bytes > PAGE_BYTES && !names.is_empty() {
                next = Some(k as u64);
                break;
            }
            names.push(n);
        }
        Reply::Names { names, next }
    }

    /// The flow whose application end is socket `key` (device, inode), if
    /// it is one of the client's user's (any, for an administrator): the
    /// answer to [`Op::FlowBySocket`]. A direct flow is found by its UDP
    /// socket, which the application reads and writes. A linear search:
    /// the question is asked once per descriptor a program inherited.
    fn flow_by_socket(&self, conn: usize, key: (u64, u64)) -> Result<Reply, CtlError> {
        let admin = self.conn_admin(conn);
        let uid = self.conn_uid(conn);
        self.flows
            .values()
            .find(|slot| {
                (admin || slot.uid == uid)
                    && (slot.app_end == Some(key)
                        || slot.direct.as_ref().and_then(sys::socket_key) == Some(key))
            })
            .map(|slot| Reply::Flow(slot.info.clone()))
            .ok_or_else(|| {
                CtlError::new(
                    ErrorKind::UnknownFlow,
                    "no flow of this user has that socket (is the descriptor a flow of this daemon?)",
                )
            })
    }

    /// One page of the flows `conn` may see (its user's; all for an
    /// administrator), those with port-ids above `after`, in port order.
    pub(super) fn list_flows(&self, conn: usize, after: u32) -> Reply {
        let admin = self.conn_admin(conn);
        let uid = self.conn_uid(conn);
        let mut ports: Vec<PortId> = self
            .flows
            .iter()
            .filter(|(&p, slot)| p > after && (admin || slot.uid == uid))
            .map(|(&p, _)| p)
            .collect();
        ports.sort_unstable();
        let mut flows = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        for port in ports {
            let slot = &self.flows[&port];
            let counters = match self.flow_counters(slot.ipcp, port) {
                Some(c) => c,
                // Gone in the IPCP with the peer's end.
                None if slot.ended => rina_wire::ctl::FlowCounters {
                    drops_in: slot.drops_in,
                    drops_out: slot.drops_out,
                    ..Default::default()
                },
                None => continue,
            };
            let f = FlowStats {
                info: slot.info.clone(),
                ipcp: self.ipcps[slot.ipcp].name.clone(),
                counters,
                held_after_end: slot.ended.then(|| self.held_for_app(port) as u64),
            };
            bytes += ctl::encode(&f).len() + 1;
            if bytes > PAGE_BYTES && !flows.is_empty() {
                next = flows.last().map(|f: &FlowStats| f.info.port);
                break;
            }
            flows.push(f);
        }
        Reply::Flows { flows, next }
    }
}

impl Conn {
    /// More answers wait for the client than it may have its requests
    /// read with ([`CONN_REPLIES_MAX`], [`CONN_REPLY_BYTES`]).
    fn backlogged(&self) -> bool {
        self.replies >= CONN_REPLIES_MAX || self.reply_bytes >= CONN_REPLY_BYTES
    }

    /// No more events are queued for the client ([`CONN_EVENTS_MAX`]): it
    /// has not read those it has, nor may it be disconnected for that.
    pub(super) fn events_full(&self) -> bool {
        self.out.len().saturating_sub(self.replies) >= CONN_EVENTS_MAX
            || self.out_bytes.saturating_sub(self.reply_bytes) >= CONN_QUEUE_BYTES / 2
    }
}

/// Refuses a QoS spec whose figures are out of their range.
fn check_qos(q: &rina_wire::QosSpec) -> Result<(), CtlError> {
    let bad = |m: String| Err(CtlError::new(ErrorKind::InvalidRequest, m));
    if let Some(p) = q.max_loss_ppm.filter(|&p| p > 1_000_000) {
        return bad(format!(
            "qos.max_loss_ppm = {p} is out of range: a loss is 0 to 1000000 parts per million"
        ));
    }
    if let Some(g) = q.max_sdu_gap.filter(|&g| g > rina_wire::qos::MAX_SDU_GAP) {
        return bad(format!(
            "qos.max_sdu_gap = {g} is out of range: a gap is 0 to {} SDUs (leave it out for any gap)",
            rina_wire::qos::MAX_SDU_GAP
        ));
    }
    if q.max_sdu_size == Some(0) {
        return bad("qos.max_sdu_size = 0 is out of range: SDUs have at least 1 byte".into());
    }
    Ok(())
}

/// The error reply that replaces a reply too large for the control socket.
fn too_big(msg: &Message, len: usize) -> Vec<u8> {
    let id = match msg {
        Message::Reply { id, .. } | Message::Progress { id, .. } => *id,
        Message::FlowRequest(_)
        | Message::FlowAccepted { .. }
        | Message::RequestWithdrawn { .. }
        | Message::Unregistered { .. } => 0,
    };
    let e = CtlError::new(
        ErrorKind::NoResources,
        format!("the reply of {len} bytes is larger than the control socket can carry (raise net.core.wmem_max)"),
    );
    ctl::encode(&Message::Reply { id, result: Err(e) })
}
