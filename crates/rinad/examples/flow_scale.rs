//! Scale benchmark (not a test): how many idle flows one `rinad` holds,
//! what each costs in resident memory, how fast flows are allocated, and
//! how much memory goes back once they close.
//!
//! One daemon with one IPCP (a shim-udp IPCP whose directory points at
//! itself, or a normal IPCP with no neighbour whose flows loop back inside
//! it). A sink registers `sink` and accepts every request, and registers
//! `sink-auto` for the daemon to accept for it (`Op::Register::accept`);
//! a source allocates flows over the raw control protocol, first one at
//! a time, alternately to each name in four rounds, then to `sink` with
//! `--outstanding` requests in flight. Every flow has both
//! of its ends in the daemon: `--flows N` makes N/2 allocations and N flows
//! (ports) in the daemon, with N descriptors here and N there.
//!
//!   cargo build --release -p rinad --bin rinad --example flow_scale
//!   target/release/examples/flow_scale --rinad target/release/rinad --dif udp --flows 100000
//!
//! With `--bundle 1`, every flow goes into one of two flow bundles (the
//! source's and the sink's, `Op::OpenBundle`) instead of a descriptor of
//! its own: the flows reached are then not bounded by the descriptor
//! limit.
//!
//! Prints one `key: value` line per figure. The figures are noisy on a
//! shared machine.

use nix::sys::socket::{self, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType};
use rina_wire::ctl::{self, Message, Op, Reply, Request};
use rina_wire::QosSpec;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A control connection spoken raw, so that requests can be pipelined.
struct Raw {
    fd: OwnedFd,
    buf: Vec<u8>,
    next_id: u64,
}

impl Raw {
    fn connect(path: &Path) -> Raw {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        let addr = socket::UnixAddr::new(path).expect("socket path");
        socket::connect(fd.as_raw_fd(), &addr).expect("connect to rinad");
        Raw {
            fd,
            buf: vec![0; ctl::MAX_CTL_MSG],
            next_id: 1,
        }
    }

    fn send(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let pkt = ctl::encode(&Request { id, op });
        socket::send(self.fd.as_raw_fd(), &pkt, MsgFlags::empty()).expect("send a request");
        id
    }

    /// The next message and the descriptor it carried.
    fn recv(&mut self) -> (Message, Option<OwnedFd>) {
        let mut cmsg = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut self.buf)];
        let msg = loop {
            match socket::recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r.expect("recvmsg"),
            }
        };
        assert!(msg.bytes > 0, "the daemon closed the control connection");
        let mut fd = None;
        for c in msg.cmsgs().expect("cmsgs") {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: the kernel just gave us this descriptor.
                    fd = Some(unsafe { OwnedFd::from_raw_fd(r) });
                }
            }
        }
        let n = msg.bytes;
        (ctl::decode(&self.buf[..n]).expect("a control message"), fd)
    }

    /// Sends `op` and waits for its reply, setting flow requests aside.
    fn call(&mut self, op: Op) -> Reply {
        let id = self.send(op);
        loop {
            if let (Message::Reply { id: r, result }, _) = self.recv() {
                if r == id {
                    return result.expect("the daemon refused");
                }
            }
        }
    }
}

struct Args {
    rinad: PathBuf,
    dif: String,
    flows: usize,
    one_at_a_time: usize,
    outstanding: usize,
    max_flows: Option<usize>,
    cep_width: Option<u8>,
    bundle: bool,
}

/// The flows one side holds: descriptors, or flows in its bundle.
#[derive(Default)]
struct Held {
    fds: Vec<OwnedFd>,
    bundled: usize,
    /// The bundle, if the flows are bundled.
    bundle: Option<(u32, OwnedFd)>,
}

impl Held {
    fn len(&self) -> usize {
        self.fds.len() + self.bundled
    }

    fn bundle(&self) -> Option<u32> {
        self.bundle.as_ref().map(|(id, _)| *id)
    }

    /// Takes the flow of a reply (or news), with the descriptor it carried.
    fn take(&mut self, info: &ctl::FlowInfo, fd: Option<OwnedFd>) -> bool {
        match (info.bundle, fd) {
            (Some(_), _) => self.bundled += 1,
            (None, Some(fd)) => self.fds.push(fd),
            (None, None) => return false,
        }
        true
    }
}

/// Opens a bundle on `raw`, for the flows of `held`.
fn open_bundle(raw: &mut Raw) -> (u32, OwnedFd) {
    let id = raw.send(Op::OpenBundle);
    loop {
        if let (Message::Reply { id: r, result }, fd) = raw.recv() {
            if r == id {
                let Ok(Reply::Bundle { id: b }) = result else {
                    panic!("the daemon refused a bundle: {result:?}");
                };
                return (b, fd.expect("the bundle's socket"));
            }
        }
    }
}

fn args() -> Args {
    let mut a = Args {
        rinad: PathBuf::from("target/release/rinad"),
        dif: "udp".into(),
        flows: 100_000,
        one_at_a_time: 4_000,
        outstanding: 64,
        max_flows: None,
        cep_width: None,
        bundle: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--rinad" => a.rinad = v.into(),
            "--dif" => a.dif = v,
            "--flows" => a.flows = v.parse().expect("--flows N"),
            "--one-at-a-time" => a.one_at_a_time = v.parse().expect("--one-at-a-time N"),
            "--outstanding" => a.outstanding = v.parse().expect("--outstanding N"),
            "--max-flows" => a.max_flows = Some(v.parse().expect("--max-flows N")),
            "--cep-width" => a.cep_width = Some(v.parse().expect("--cep-width 2|4|8")),
            "--bundle" => a.bundle = v == "1" || v == "true",
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

fn config(a: &Args, port: u16) -> String {
    let max = a
        .max_flows
        .map_or(String::new(), |m| format!("max_flows = {m}\n"));
    match a.dif.as_str() {
        "udp" => format!(
            "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n{max}\n[ipcp.directory]\n\"sink\" = \"127.0.0.1:{port}\"\n\"sink-auto\" = \"127.0.0.1:{port}\"\n"
        ),
        "normal" => {
            let cep = a
                .cep_width
                .map_or(String::new(), |w| format!("cep_id_bytes = {w}\n"));
            format!(
                "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n{max}{cep}\n[ipcp.names]\n\"sink\" = 1\n\"sink-auto\" = 1\n"
            )
        }
        d => panic!("--dif udp or normal, not {d}"),
    }
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// CPU time (user + system) of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

struct Daemon(Child, PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn start(a: &Args) -> (Daemon, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rina-flow-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap();
    let conf = dir.join("s.toml");
    std::fs::write(&conf, config(a, port)).unwrap();
    let sock = dir.join("s.sock");
    let child = Command::new(&a.rinad)
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(&sock)
        .arg("--log-level")
        .arg("error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start rinad");
    let d = Daemon(child, dir);
    let end = Instant::now() + Duration::from_secs(10);
    while socket_alive(&sock).is_none() {
        assert!(Instant::now() < end, "rinad did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    (d, sock)
}

fn socket_alive(sock: &Path) -> Option<()> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    let addr = socket::UnixAddr::new(sock).ok()?;
    socket::connect(fd.as_raw_fd(), &addr).ok()
}

/// Accepts every request on `sink`, pipelined, until `n` flows are held
/// or nothing came for 10 s.
fn run_sink(mut sink: Raw, n: usize, mut kept: Held) -> Held {
    kept.fds.reserve(if kept.bundle.is_some() { 0 } else { n });
    let mut failed = 0;
    while kept.len() + failed < n {
        let mut pfd = libc::pollfd {
            fd: sink.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 10_000) } == 0 {
            break;
        }
        match sink.recv() {
            (Message::FlowRequest(req), _) => {
                sink.send(Op::Accept {
                    handle: req.handle,
                    rings: false,
                    direct: false,
                    bundle: kept.bundle(),
                });
            }
            (
                Message::Reply {
                    result: Ok(Reply::Flow(info)),
                    ..
                },
                fd,
            )
            | (Message::FlowAccepted { flow: info, .. }, fd) => {
                kept.take(&info, fd);
            }
            (Message::Reply { result: Err(e), .. }, _) => {
                eprintln!("accept failed: {e}");
                failed += 1;
            }
            _ => {}
        }
    }
    kept
}

/// Allocates `n` flows with at most `window` requests in flight; returns
/// the flows and the failures.
fn allocate(src: &mut Raw, remote: &str, n: usize, window: usize, flows: &mut Held) -> usize {
    let bundle = flows.bundle();
    let op = || Op::Allocate {
        local: "src".parse().unwrap(),
        remote: remote.parse().unwrap(),
        dif: None,
        qos: QosSpec::default(),
        rings: false,
        direct: false,
        bundle,
    };
    let (mut sent, mut done, mut failed) = (0, 0, 0);
    let mut first_error = None;
    while done < n {
        while sent < n && sent - done < window {
            src.send(op());
            sent += 1;
        }
        match src.recv() {
            (
                Message::Reply {
                    result: Ok(Reply::Flow(info)),
                    ..
                },
                fd,
            ) => {
                if !flows.take(&info, fd) {
                    failed += 1;
                    first_error.get_or_insert("a flow without its descriptor".into());
                }
            }
            (Message::Reply { result: Err(e), .. }, _) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
            _ => continue,
        }
        done += 1;
    }
    if let Some(e) = first_error {
        eprintln!("{failed} allocations failed; the first: {e}");
    }
    failed
}

fn main() {
    let mut a = args();
    let asked = a.flows;
    // Both ends of every flow are descriptors here and in the daemon,
    // which inherits this limit (and raises it further only if allowed).
    let limit = rina::raise_fd_limit(a.flows as u64 + 1000);
    let fit = (limit.saturating_sub(200) as usize) & !1;
    if a.flows > fit && !a.bundle {
        a.flows = fit;
    }
    let (d, sock) = start(&a);
    let pid = d.0.id();
    let pairs = a.flows / 2;
    let mut sink = Raw::connect(&sock);
    let mut kept = Held::default();
    let mut flows = Held::default();
    let mut src = Raw::connect(&sock);
    if a.bundle {
        kept.bundle = Some(open_bundle(&mut sink));
        flows.bundle = Some(open_bundle(&mut src));
    } else {
        flows.fds.reserve(pairs);
    }
    sink.call(Op::Register {
        name: "sink".parse().unwrap(),
        dif: None,
        accept: None,
    });
    sink.call(Op::Register {
        name: "sink-auto".parse().unwrap(),
        dif: None,
        accept: Some(ctl::AutoAccept {
            bundle: kept.bundle(),
            ..Default::default()
        }),
    });
    let sink = std::thread::spawn(move || run_sink(sink, pairs, kept));
    std::thread::sleep(Duration::from_millis(300));
    let rss0 = rss(pid);

    // At most half one at a time, so that both rates are measured.
    // Half to each name, alternated in rounds so that both see the same
    // host.
    let one = a.one_at_a_time.min(pairs / 2) / 8 * 8;
    let mut failed = 0;
    let mut took = [Duration::ZERO; 2];
    for round in 0..8 {
        let t = Instant::now();
        let remote = ["sink", "sink-auto"][round % 2];
        failed += allocate(&mut src, remote, one / 8, 1, &mut flows);
        took[round % 2] += t.elapsed();
    }
    let one_rate = (one / 2) as f64 / took[0].as_secs_f64();
    let auto_rate = (one / 2) as f64 / took[1].as_secs_f64();
    let rest = pairs - one;
    let t = Instant::now();
    failed += allocate(&mut src, "sink", rest, a.outstanding, &mut flows);
    let many_rate = rest as f64 / t.elapsed().as_secs_f64();
    let accepted = sink.join().expect("sink");
    let reached = flows.len() + accepted.len();

    std::thread::sleep(Duration::from_secs(1));
    let rss1 = rss(pid);
    let idle = Duration::from_secs(5);
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(idle);
    let clk = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let idle_cpu = (cpu_ticks(pid) - c0) as f64 / clk / t0.elapsed().as_secs_f64() * 100.0;

    let fds_before = open_fds(pid);
    let fds_of_flows = flows.fds.len() + accepted.fds.len();
    let t = Instant::now();
    drop(flows);
    drop(accepted);
    let end = Instant::now() + Duration::from_secs(120);
    while open_fds(pid) + fds_of_flows > fds_before + 16 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Bundled flows hold no descriptor: the daemon lists none once closed.
    if a.bundle {
        let mut ctl = Raw::connect(&sock);
        while Instant::now() < end {
            match ctl.call(Op::ListFlows { after: None }) {
                Reply::Flows { flows, .. } if flows.is_empty() => break,
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let close_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let rss2 = rss(pid);
    let per = |b: u64| (b.saturating_sub(rss0)) as f64 / reached.max(1) as f64;

    println!("dif: {}", a.dif);
    println!("descriptor limit: {limit}");
    if a.bundle {
        println!("flows in bundles: yes (two descriptors in the daemon for all of them)");
    }
    println!("descriptors in the daemon with the flows: {fds_before}");
    if asked > a.flows {
        println!(
            "flows asked: {asked}, cut to {} by the descriptor limit",
            a.flows
        );
    }
    println!("flows tried: {} ({} allocations)", pairs * 2, pairs);
    println!("flows reached: {reached} (failed allocations: {failed})");
    println!("rss before: {:.1} MiB", rss0 as f64 / 1048576.0);
    println!("rss with flows: {:.1} MiB", rss1 as f64 / 1048576.0);
    println!("bytes per idle flow: {:.0}", per(rss1));
    println!(
        "allocations/s one at a time: {one_rate:.0} ({} allocations)",
        one / 2
    );
    println!(
        "allocations/s one at a time, accepted by the daemon: {auto_rate:.0} ({} allocations)",
        one / 2
    );
    println!(
        "allocations/s with {} outstanding: {many_rate:.0} ({rest} allocations)",
        a.outstanding
    );
    println!("idle cpu with flows: {idle_cpu:.1} % of a core");
    println!("close of all flows: {close_secs:.1} s");
    println!(
        "rss after close: {:.1} MiB ({:.1} MiB more than before, {:.1} MiB returned)",
        rss2 as f64 / 1048576.0,
        rss2.saturating_sub(rss0) as f64 / 1048576.0,
        rss1.saturating_sub(rss2) as f64 / 1048576.0
    );
}
