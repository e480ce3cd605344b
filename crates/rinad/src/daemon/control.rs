//! The control socket: connections from applications and tools, their
//! requests (register, allocate, accept, list, ...) and the replies.

use super::*;

impl Daemon {
    // ---- control connections ---------------------------------------------

    pub(super) fn accept_conns(&mut self) {
        loop {
            match sys::accept(&self.listener) {
                Ok(Some(fd)) => {
                    if self.conns.len() >= MAX_CONNS {
                        warn!(
                            max = MAX_CONNS,
                            "too many control connections; closing the new one"
                        );
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
                    debug!(conn = id, "client connected");
                    self.conns.insert(
                        id,
                        Conn {
                            fd,
                            out: VecDeque::new(),
                            out_bytes: 0,
                            names: Vec::new(),
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
    }

    pub(super) fn read_conn(&mut self, id: usize) {
        for _ in 0..BUDGET {
            let Some(conn) = self.conns.get(&id) else {
                return;
            };
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
            self.ipcps[i].unregister(&name);
            self.owners.remove(&(i, name.clone()));
            info!(%name, ipcp = %self.ipcps[i].name, "unregistered (client gone)");
        }
        let theirs: Vec<u64> = self
            .incoming
            .iter()
            .filter(|(_, inc)| inc.conn == id)
            .map(|(h, _)| *h)
            .collect();
        for h in theirs {
            if let Some(inc) = self.incoming.remove(&h) {
                let _ = self.ipcps[inc.ipcp].refuse(inc.ipcp_handle, "the application went away");
            }
        }
        debug!(conn = id, "client disconnected");
    }

    pub(super) fn reply(
        &mut self,
        conn: usize,
        id: u64,
        result: Result<Reply, CtlError>,
        fd: Option<OwnedFd>,
    ) {
        self.send_msg(conn, &Message::Reply { id, result }, fd);
    }

    pub(super) fn send_msg(&mut self, id: usize, msg: &Message, fd: Option<OwnedFd>) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut bytes = ctl::encode(msg);
        if conn.out.is_empty() {
            let raw = fd.as_ref().map(|f| f.as_raw_fd());
            match sys::send(conn.fd.as_raw_fd(), &bytes, raw) {
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
        conn.out.push_back((bytes, fd));
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
        while let Some((bytes, fd)) = conn.out.front() {
            let raw = fd.as_ref().map(|f| f.as_raw_fd());
            match sys::send(conn.fd.as_raw_fd(), bytes, raw) {
                Ok(Sent::Done) => {
                    conn.out_bytes -= bytes.len();
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
                    if let Some(front) = conn.out.front_mut() {
                        *front = (err, None);
                    }
                }
                Ok(Sent::WouldBlock) => return,
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
            Op::Register { name, dif } => self.register(conn, name, dif),
            Op::Unregister { name, dif } => self.unregister(conn, &name, dif),
            Op::Allocate {
                local,
                remote,
                dif,
                qos,
                rings,
            } => {
                let pa = PendingAlloc {
                    conn,
                    id,
                    local,
                    remote,
                    qos,
                    rings,
                };
                match self.allocate(pa, dif) {
                    Ok(()) => return,
                    Err(e) => Err(e),
                }
            }
            Op::Accept { handle, rings } => {
                match self.accept_incoming(conn, handle, rings) {
                    Ok((info, fd)) => self.reply(conn, id, Ok(Reply::Flow(info)), Some(fd)),
                    Err(e) => self.reply(conn, id, Err(e), None),
                }
                return;
            }
            Op::Refuse { handle, reason } => self.refuse_incoming(conn, handle, &reason),
            Op::Deallocate { port } => match self.flows.get(&port) {
                Some(slot) if slot.owner == conn => {
                    self.close_flow(port, true);
                    Ok(Reply::Done)
                }
                // Another client's flow looks the same as no flow at all.
                _ => Err(CtlError::new(
                    ErrorKind::UnknownFlow,
                    format!("this client has no flow with port-id {port}"),
                )),
            },
            Op::ListIpcps => Ok(Reply::Ipcps {
                ipcps: self.list_ipcps(),
            }),
            Op::ListDifs => Ok(Reply::Difs {
                difs: self.list_difs(),
            }),
            Op::ListNames => Ok(Reply::Names {
                names: self.list_names(),
            }),
            Op::ListFlows => Ok(Reply::Flows {
                flows: self.list_flows(),
            }),
            Op::ReadRib { ipcp, path, depth } => self.read_rib(&ipcp, path.as_deref(), depth),
            Op::Scheduler { ipcp, set } => self.scheduler(&ipcp, set),
        };
        self.reply(conn, id, result, None);
    }

    /// IPCPs in `dif`, or every IPCP without one.
    pub(super) fn ipcps_in(&self, dif: Option<&str>) -> Result<Vec<usize>, CtlError> {
        if self.ipcps.is_empty() {
            return Err(CtlError::new(
                ErrorKind::NoDif,
                format!("system {} has no IPC process", self.system),
            ));
        }
        match dif {
            None => Ok((0..self.ipcps.len()).collect()),
            Some(d) => {
                let v: Vec<usize> = (0..self.ipcps.len())
                    .filter(|&i| self.ipcps[i].dif == d)
                    .collect();
                if v.is_empty() {
                    let known: Vec<&str> = self.ipcps.iter().map(|ip| ip.dif.as_str()).collect();
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
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
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
        let mut difs = Vec::new();
        for i in targets {
            self.ipcps[i].register(name.clone())?;
            self.owners.insert((i, name.clone()), conn);
            if let Some(c) = self.conns.get_mut(&conn) {
                c.names.push((i, name.clone()));
            }
            info!(%name, ipcp = %self.ipcps[i].name, "registered");
            difs.push(self.ipcps[i].dif.clone());
        }
        Ok(Reply::Registered { difs })
    }

    pub(super) fn unregister(
        &mut self,
        conn: usize,
        name: &AppName,
        dif: Option<String>,
    ) -> Result<Reply, CtlError> {
        let targets = self.ipcps_in(dif.as_deref())?;
        let mut found = false;
        for i in targets {
            if self.owners.get(&(i, name.clone())) == Some(&conn) {
                self.owners.remove(&(i, name.clone()));
                self.ipcps[i].unregister(name);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.names.retain(|(j, n)| !(*j == i && n == name));
                }
                found = true;
            }
        }
        if found {
            Ok(Reply::Done)
        } else {
            Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!("{name} is not registered by this client"),
            ))
        }
    }

    /// Starts allocation `pa` in `dif` (or the first DIF that knows the
    /// remote name); the reply follows when the IPCP answers.
    pub(super) fn allocate(
        &mut self,
        pa: PendingAlloc,
        dif: Option<String>,
    ) -> Result<(), CtlError> {
        let remote = pa.remote.clone();
        let candidates = self.ipcps_in(dif.as_deref())?;
        let i = candidates
            .iter()
            .copied()
            .find(|&i| self.ipcps[i].knows(&remote))
            .ok_or_else(|| {
                CtlError::new(
                    ErrorKind::NameNotFound,
                    match &dif {
                        Some(d) => format!("{remote} is not known in DIF {d}"),
                        None => format!("no DIF of system {} knows {remote}", self.system),
                    },
                )
            })?;
        let port = self.free_port();
        let now = self.now();
        self.ipcps[i].allocate(now, port, pa.local.clone(), remote.clone(), pa.qos)?;
        info!(port, local = %pa.local, %remote, ipcp = %self.ipcps[i].name, "allocating");
        self.allocs.insert(port, pa);
        Ok(())
    }

    pub(super) fn accept_incoming(
        &mut self,
        conn: usize,
        handle: u64,
        rings: bool,
    ) -> Result<(FlowInfo, OwnedFd), CtlError> {
        let inc = self.take_incoming(conn, handle)?;
        let port = self.free_port();
        let now = self.now();
        let max_sdu = self.ipcps[inc.ipcp].accept(now, inc.ipcp_handle, port)?;
        let info = FlowInfo {
            port,
            dif: self.ipcps[inc.ipcp].dif.clone(),
            local: inc.local,
            remote: inc.remote,
            qos: inc.qos,
            max_sdu,
        };
        match self.open_flow(inc.ipcp, conn, info, rings) {
            Ok((info, fd)) => {
                info!(port, local = %info.local, remote = %info.remote, "flow accepted");
                Ok((info, fd))
            }
            Err(e) => {
                self.ipcps[inc.ipcp].deallocate(now, port);
                Err(e)
            }
        }
    }

    pub(super) fn refuse_incoming(
        &mut self,
        conn: usize,
        handle: u64,
        reason: &str,
    ) -> Result<Reply, CtlError> {
        let inc = self.take_incoming(conn, handle)?;
        self.ipcps[inc.ipcp].refuse(inc.ipcp_handle, reason)?;
        Ok(Reply::Done)
    }

    pub(super) fn take_incoming(&mut self, conn: usize, handle: u64) -> Result<Incoming, CtlError> {
        match self.incoming.get(&handle) {
            Some(inc) if inc.conn == conn => Ok(self.incoming.remove(&handle).expect("present")),
            _ => Err(CtlError::new(
                ErrorKind::InvalidRequest,
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
        let known: Vec<String> = self.ipcps.iter().map(|ip| ip.name.clone()).collect();
        let Some(ip) = self.ipcps.iter_mut().find(|ip| ip.name == ipcp) else {
            return Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "no IPCP named {ipcp:?}; this system has {}",
                    known.join(", ")
                ),
            ));
        };
        let kind = ip.kind();
        let Imp::Normal(n) = &mut ip.imp else {
            return Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "IPCP {ipcp} is a {kind} IPCP; only normal IPCPs have an RMT scheduling policy"
                ),
            ));
        };
        if let Some(v) = set {
            let bad = |m: String| CtlError::new(ErrorKind::InvalidRequest, m);
            let cfg: SchedulerConfig = serde_json::from_value(v)
                .map_err(|e| bad(format!("bad scheduling policy: {e}")))?;
            let cu = rina_core::normal::cubes::cu_map(&n.machine.config().cubes);
            let sched = cfg.build(&cu).map_err(|e| bad(e.to_string()))?;
            n.machine.rmt_mut().set_scheduler(sched);
            info!(ipcp, policy = cfg.name(), "RMT scheduling policy changed");
            n.sched = cfg;
        }
        let rmt = n.machine.rmt();
        let ports = rmt
            .ports()
            .map(|port| PortQueues {
                port,
                neighbor: n
                    .neighbors
                    .iter()
                    .find(|nb| nb.port == Some(port))
                    .map(|nb| nb.name.to_string()),
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
            config: serde_json::to_value(&n.sched).unwrap_or_default(),
            ports,
        }))
    }

    // ---- listings ----------------------------------------------------------

    pub(super) fn read_rib(
        &self,
        ipcp: &str,
        path: Option<&str>,
        depth: Option<u32>,
    ) -> Result<Reply, CtlError> {
        let Some(ip) = self.ipcps.iter().find(|ip| ip.name == ipcp) else {
            let known: Vec<&str> = self.ipcps.iter().map(|ip| ip.name.as_str()).collect();
            return Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "no IPCP named {ipcp:?}; this system has {}",
                    known.join(", ")
                ),
            ));
        };
        let rib = self.ipcp_rib(ip);
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

    pub(super) fn list_ipcps(&self) -> Vec<IpcpInfo> {
        self.ipcps
            .iter()
            .map(|ip| IpcpInfo {
                name: ip.name.clone(),
                kind: ip.kind().into(),
                dif: ip.dif.clone(),
                address: ip.address(),
                flows: ip.flow_count(),
                names: ip.names(),
                counters: ip.counters(),
            })
            .collect()
    }

    pub(super) fn list_difs(&self) -> Vec<DifInfo> {
        let mut difs: BTreeMap<&str, (&'static str, Vec<String>)> = BTreeMap::new();
        for ip in &self.ipcps {
            let e = difs.entry(&ip.dif).or_insert((ip.kind(), Vec::new()));
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

    pub(super) fn list_names(&self) -> Vec<NameInfo> {
        self.ipcps
            .iter()
            .flat_map(|ip| {
                ip.names().into_iter().map(|name| NameInfo {
                    name,
                    dif: ip.dif.clone(),
                    ipcp: ip.name.clone(),
                })
            })
            .collect()
    }

    pub(super) fn list_flows(&self) -> Vec<FlowStats> {
        let mut v: Vec<FlowStats> = self
            .flows
            .iter()
            .filter_map(|(&port, slot)| {
                let ip = &self.ipcps[slot.ipcp];
                Some(FlowStats {
                    info: slot.info.clone(),
                    ipcp: ip.name.clone(),
                    counters: ip.flow_counters(port)?,
                })
            })
            .collect();
        v.sort_by_key(|f| f.info.port);
        v
    }
}

/// The error reply that replaces a reply too large for the control socket.
fn too_big(msg: &Message, len: usize) -> Vec<u8> {
    let id = match msg {
        Message::Reply { id, .. } => *id,
        Message::FlowRequest(_) => 0,
    };
    let e = CtlError::new(
        ErrorKind::NoResources,
        format!("the reply of {len} bytes is larger than the control socket can carry (raise net.core.wmem_max)"),
    );
    ctl::encode(&Message::Reply { id, result: Err(e) })
}
