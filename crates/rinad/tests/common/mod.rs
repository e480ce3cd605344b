//! Test harness: real `rinad` processes on loopback, each with its own
//! socket in a temporary directory, killed when the test ends.

#![allow(dead_code)]

pub mod relay;
pub mod users;

use rina::{AppName, Client};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `rinad`.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: PathBuf,
    pub name: String,
}

/// A fresh directory under the system temp dir, removed by the test at exit
/// of the daemon guard.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "rinad-test-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_suffix()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rand_suffix() -> u128 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    RandomState::new().build_hasher().finish() as u128
}

pub fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

/// Waits for `cond` with a deadline; panics with `what` if it never holds.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return;
        }
        std::thread::yield_now();
        std::thread::park_timeout(Duration::from_millis(10));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

impl Daemon {
    /// Starts a daemon named `name` with one shim-udp IPCP in DIF `udp`
    /// bound to an ephemeral loopback port and the given directory entries.
    pub fn start(name: &str, directory: &[(&str, String)]) -> Daemon {
        Self::start_bound(name, "127.0.0.1:0", directory)
    }

    /// Like [`Daemon::start`], with the shim bound to `bind`.
    pub fn start_bound(name: &str, bind: &str, directory: &[(&str, String)]) -> Daemon {
        Self::start_system(name, "", bind, directory)
    }

    /// Like [`Daemon::start_bound`], with `system` (lines of TOML) added to
    /// the `[system]` section.
    pub fn start_system(
        name: &str,
        system: &str,
        bind: &str,
        directory: &[(&str, String)],
    ) -> Daemon {
        let mut cfg = format!(
            "[system]\nname = \"{name}\"\n{system}\n\n[[ipcp]]\nname = \"{name}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"{bind}\"\nmax_sdu = 1400\n\n[ipcp.directory]\n"
        );
        for (n, a) in directory {
            cfg.push_str(&format!("\"{n}\" = \"{a}\"\n"));
        }
        Self::start_with(name, &cfg)
    }

    /// Starts a daemon with the given configuration text.
    pub fn start_with(name: &str, cfg: &str) -> Daemon {
        Self::start_with_umask(name, cfg, None)
    }

    /// [`Daemon::start_with`], the daemon started with file mode creation
    /// mask `umask` if given (else this process's).
    pub fn start_with_umask(name: &str, cfg: &str, umask: Option<u32>) -> Daemon {
        let dir = temp_dir(name);
        let conf = dir.join("rinad.toml");
        std::fs::write(&conf, cfg).unwrap();
        let socket = dir.join("rinad.sock");
        let log = std::fs::File::create(dir.join("rinad.log")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rinad"));
        if let Some(mask) = umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and touches nothing else.
            unsafe {
                cmd.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--config")
            .arg(&conf)
            .arg("--socket")
            .arg(&socket)
            .arg("--log-level")
            .arg("debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rinad");
        let d = Daemon {
            child,
            socket,
            dir,
            name: name.into(),
        };
        wait_for("rinad to answer", Duration::from_secs(10), || {
            Client::connect_to(&d.socket).is_ok()
        });
        d
    }

    pub fn client(&self) -> Client {
        Client::connect_to(&self.socket).expect("connect to rinad")
    }

    /// The UDP address the daemon's shim IPCP is bound to.
    pub fn udp_addr(&self) -> String {
        self.client().list_ipcps().unwrap()[0].address.clone()
    }

    /// An IPCP counter.
    pub fn counter(&self, key: &str) -> u64 {
        self.client().list_ipcps().unwrap()[0].counters[key]
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join("rinad.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn path(&self) -> &Path {
        &self.socket
    }

    /// How many IPCPs the daemon lists to a new client, asked from another
    /// thread and waited for at most `t`: a daemon whose event loop is
    /// blocked gives no answer (`None`).
    pub fn answers_within(&self, t: Duration) -> Option<rina::Result<usize>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = self.socket.clone();
        std::thread::spawn(move || {
            let r = Client::connect_to(&path).and_then(|mut c| c.list_ipcps());
            let _ = tx.send(r.map(|v| v.len()));
        });
        rx.recv_timeout(t).ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.name, self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two daemons: `beta` serves, `alpha` knows `beta`'s names.
pub fn pair(names_at_beta: &[&str]) -> (Daemon, Daemon) {
    pair_bound("127.0.0.1:0", names_at_beta)
}

/// Like [`pair`], with both shims bound to `bind` (e.g. `[::1]:0`).
pub fn pair_bound(bind: &str, names_at_beta: &[&str]) -> (Daemon, Daemon) {
    let beta = Daemon::start_bound("beta", bind, &[]);
    let addr = beta.udp_addr();
    let dir: Vec<(&str, String)> = names_at_beta.iter().map(|n| (*n, addr.clone())).collect();
    let alpha = Daemon::start_bound("alpha", bind, &dir);
    (alpha, beta)
}

/// Registers `echo` in DIF `dif` at `d` and echoes every SDU of the first
/// flow it accepts, until that flow or the daemon goes away.
pub fn echo_server(d: &Daemon, dif: &str) -> std::thread::JoinHandle<()> {
    let mut srv = d.client();
    srv.register(&name("echo"), Some(dif)).unwrap();
    std::thread::spawn(move || {
        let Ok(req) = srv.next_request() else { return };
        let Ok(flow) = srv.accept(&req) else { return };
        let mut buf = vec![0u8; 70_000];
        while let Ok(n) = flow.read(&mut buf) {
            if flow.write(&buf[..n]).is_err() {
                break;
            }
        }
        drop(srv);
    })
}

/// Registers `echo` in DIF `dif` at `d` and echoes every SDU of every flow
/// it accepts (each in a thread of its own) until no request has come for
/// 30 s or the daemon goes away.
pub fn echo_server_all(d: &Daemon, dif: &str) -> std::thread::JoinHandle<()> {
    let mut c = d.client();
    assert_eq!(c.register(&name("echo"), Some(dif)).unwrap(), vec![dif]);
    std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 70_000];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// Writes `sdu` on `flow` and returns the SDU that comes back within 10 s.
pub fn roundtrip(flow: &rina::Flow, sdu: &[u8]) -> Vec<u8> {
    flow.write(sdu).unwrap();
    let mut buf = vec![0u8; 65_536];
    let n = flow
        .read_timeout(&mut buf, Duration::from_secs(10))
        .unwrap()
        .expect("a reply within the deadline");
    buf.truncate(n);
    buf
}

/// A UDP port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    rina::ports::unused_loopback_udp_port().expect("a free UDP port on loopback")
}

/// The configuration of system `me`: shim-udp `me.udp` on `port`, whose
/// directory puts `peer.net` at `peer_udp`, and normal IPCP `me.net` at
/// `addr` (with CRC) over it, neighbour of `peer.net` at `peer_addr`;
/// `names` are the lines of its `[ipcp.names]` table, and `extra` is
/// appended after it (QoS cubes of `me.net`, say).
pub fn normal_over_udp(
    me: &str,
    (addr, port): (u64, u16),
    (peer, peer_addr, peer_udp): (&str, u64, u16),
    names: &str,
    extra: &str,
) -> String {
    format!(
        r#"[system]
name = "{me}"

[[ipcp]]
name = "{me}.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:{port}"

[ipcp.directory]
"{peer}.net" = "127.0.0.1:{peer_udp}"

[[ipcp]]
name = "{me}.net"
type = "normal"
dif = "net"
address = {addr}
crc = true

[[ipcp.neighbor]]
name = "{peer}.net"
over = "udp"
address = {peer_addr}

[ipcp.names]
{names}
{extra}"#
    )
}

/// Two systems, `alpha` at address 1 and `beta` at 2, whose normal IPCPs
/// (DIF `net`) are neighbours over a shim DIF over UDP, once their N-1
/// flow is up: `names` are the lines of alpha's `[ipcp.names]`, and each
/// configuration is passed through `edit` first.
pub fn normal_pair_with(names: &str, edit: impl Fn(String) -> String) -> (Daemon, Daemon) {
    let (pa, pb) = (free_port(), free_port());
    let alpha = Daemon::start_with(
        "alpha",
        &edit(normal_over_udp(
            "alpha",
            (1, pa),
            ("beta", 2, pb),
            names,
            "",
        )),
    );
    let beta = Daemon::start_with(
        "beta",
        &edit(normal_over_udp("beta", (2, pb), ("alpha", 1, pa), "", "")),
    );
    wait_for(
        "the N-1 flow between the normal IPCPs",
        Duration::from_secs(15),
        || {
            counter(&alpha, "alpha.net", "neighbors_up") == 1
                && counter(&beta, "beta.net", "neighbors_up") == 1
        },
    );
    (alpha, beta)
}

/// Waits until daemon `d` lists flow `port` as ended by its peer
/// (`held_after_end`): how many SDUs it holds for the application.
pub fn held_after_end(d: &Daemon, port: u32) -> u64 {
    let mut held = None;
    wait_for(
        "the daemon to list the flow as ended",
        Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(50));
            let flows = d.client().list_flows().unwrap();
            let f = flows.iter().find(|f| f.info.port == port);
            held = f.expect("the flow is listed").held_after_end;
            held.is_some()
        },
    );
    held.unwrap_or(0)
}

/// What the reliable cube serves: reliable, in-order delivery.
pub fn reliable_in_order() -> rina::QosSpec {
    rina::QosSpec {
        reliable: true,
        in_order: true,
        ..Default::default()
    }
}

/// Counter `key` of IPCP `ipcp` at `d` (0 when absent).
pub fn counter(d: &Daemon, ipcp: &str, key: &str) -> u64 {
    d.client()
        .list_ipcps()
        .unwrap()
        .into_iter()
        .find(|i| i.name == ipcp)
        .and_then(|i| i.counters.get(key).copied())
        .unwrap_or(0)
}

/// CPU time (user and system) process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (in parentheses, which may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis((f[0] + f[1]) * 1000 / hz)
}
