//! The `ssh` backend end to end on this machine: three network namespaces
//! on a bridge stand in for hosts, each running Debian's `sshd` with a key
//! generated here; line-3 (shortened) runs through the backend over
//! shim-udp between the namespaces' addresses and over shim-eth on veth
//! pairs between them, then a second run is
//! interrupted during its traffic, then a remote program's ssh client is
//! killed (as if rina-lab died): nothing may be left running. Needs root, `sshd`, `ssh`, `scp` and
//! `ssh-keygen` (`.ci/run` installs openssh-server and openssh-client);
//! otherwise it prints "skipped: ..." and passes.

#[path = "real_common/mod.rs"]
mod common;

use rina_lab::backend::ssh::{Inventory, Ssh};
use rina_lab::backend::{Backend, RunCtx};
use rina_lab::LabError;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
const HOSTS: usize = 3;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn runs(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Why this test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces)".into());
    }
    if !Path::new(SSHD).is_file() {
        return Some(format!("no {SSHD} (apt-get install openssh-server)"));
    }
    for t in ["ssh", "scp", "ssh-keygen"] {
        if !runs(t, "-V") && !runs(t, "--help") {
            return Some(format!("no {t} (apt-get install openssh-client)"));
        }
    }
    if !runs("ip", "-V") {
        return Some("no ip (iproute2)".into());
    }
    None
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "`{}`: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Namespaces with sshd on a bridge; removed on drop.
struct Lab {
    pid: u32,
    dir: PathBuf,
    sshd: Vec<Child>,
    /// Remote folder of the backend (shared by the namespaces).
    remote: String,
}

impl Lab {
    fn ns(&self, i: usize) -> String {
        format!("rlsh{}-{i}", self.pid)
    }
    fn bridge(&self) -> String {
        format!("rlsb{}", self.pid)
    }
    fn addr(&self, i: usize) -> String {
        format!("10.231.{}.{}", self.pid % 250, i + 1)
    }

    fn start(dir: &Path) -> Lab {
        let pid = std::process::id();
        let mut lab = Lab {
            pid,
            dir: dir.to_path_buf(),
            sshd: Vec::new(),
            remote: format!("/tmp/rlssh-{pid}"),
        };
        let br = lab.bridge();
        sh(&["ip", "link", "add", &br, "type", "bridge"]);
        sh(&["ip", "link", "set", &br, "up"]);
        let key = dir.join("id");
        let host_key = dir.join("host_key");
        for k in [&key, &host_key] {
            sh(&[
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                k.to_str().unwrap(),
            ]);
        }
        std::fs::create_dir_all("/run/sshd").unwrap();
        for i in 0..HOSTS {
            let ns = lab.ns(i);
            let (outer, inner) = (format!("rlsv{pid}h{i}"), format!("rlsv{pid}n{i}"));
            sh(&["ip", "netns", "add", &ns]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            sh(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            sh(&["ip", "link", "set", &inner, "netns", &ns]);
            sh(&["ip", "link", "set", &outer, "master", &br]);
            sh(&["ip", "link", "set", &outer, "up"]);
            let cidr = format!("{}/24", lab.addr(i));
            sh(&["ip", "-n", &ns, "addr", "add", &cidr, "dev", &inner]);
            sh(&["ip", "-n", &ns, "link", "set", &inner, "up"]);
            let conf = dir.join(format!("sshd-{i}.conf"));
            let text = format!(
                "ListenAddress {}\nPort 22\nHostKey {}\nAuthorizedKeysFile {}.pub\n\
                 PidFile none\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 Subsystem sftp /usr/lib/openssh/sftp-server\n",
                lab.addr(i),
                host_key.display(),
                key.display()
            );
            std::fs::write(&conf, text).unwrap();
            let log = std::fs::File::create(dir.join(format!("sshd-{i}.log"))).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", &ns, SSHD, "-D", "-e", "-f"])
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            lab.sshd.push(child);
        }
        // Direct veth pairs for shim-eth: a--b between the first two
        // namespaces, b--c between the last two.
        for l in 0..HOSTS - 1 {
            let [a, b] = lab.eth(l);
            sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
            for (dev, ns) in [(&a, lab.ns(l)), (&b, lab.ns(l + 1))] {
                sh(&["ip", "link", "set", dev, "netns", &ns]);
                sh(&["ip", "-n", &ns, "link", "set", dev, "up"]);
            }
        }
        // The root namespace reaches the namespaces over the bridge.
        let cidr = format!("10.231.{}.254/24", pid % 250);
        sh(&["ip", "addr", "add", &cidr, "dev", &br]);
        lab
    }

    /// The veth ends of line-3's link `l` (in namespaces `l` and `l + 1`).
    fn eth(&self, l: usize) -> [String; 2] {
        [
            format!("rle{}a{l}", self.pid),
            format!("rle{}b{l}", self.pid),
        ]
    }

    /// The inventory with line-3's links as shim-eth on the veth pairs.
    fn inventory_eth(&self) -> String {
        let mut t = self.inventory();
        for (l, (x, y)) in [("a", "b"), ("b", "c")].into_iter().enumerate() {
            let [ea, eb] = self.eth(l);
            t += &format!("[link.\"{x}--{y}\"]\neth = {{ {x} = \"{ea}\", {y} = \"{eb}\" }}\n");
        }
        t
    }

    fn inventory(&self) -> String {
        let mut t = format!(
            "user = \"root\"\nkey = \"{}\"\ndir = \"{}\"\n\
             ssh_options = [\"-o\", \"StrictHostKeyChecking=no\", \"-o\", \"UserKnownHostsFile=/dev/null\"]\n",
            self.dir.join("id").display(),
            self.remote
        );
        for (i, node) in ["a", "b", "c"].iter().enumerate() {
            t += &format!(
                "[[host]]\nname = \"h{i}\"\naddress = \"{}\"\nnodes = [\"{node}\"]\n",
                self.addr(i)
            );
        }
        t
    }

    /// Waits until every sshd takes a command.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..HOSTS {
            loop {
                let ok = Command::new("ssh")
                    .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
                    .args([
                        "-o",
                        "UserKnownHostsFile=/dev/null",
                        "-o",
                        "ConnectTimeout=2",
                    ])
                    .arg("-i")
                    .arg(self.dir.join("id"))
                    .arg(format!("root@{}", self.addr(i)))
                    .arg("true")
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sshd in {} not ready (see {})",
                    self.ns(i),
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.sshd {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 0..HOSTS {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .status();
        let _ = std::fs::remove_dir_all(&self.remote);
    }
}

/// Processes whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in rd.flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                v.push(c);
            }
        }
    }
    v
}

/// The run folders the backend left under the remote folder.
fn run_dirs_left(remote: &str) -> Vec<String> {
    std::fs::read_dir(remote)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("run-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn line_3_runs_over_ssh_between_namespaces_and_cleans_up() {
    if let Some(why) = missing() {
        println!("skipped: {why}");
        return;
    }
    common::ensure_binaries();
    let dir = common::run_dir("ssh-line-3");
    let lab_dir = dir.join("lab");
    std::fs::create_dir_all(&lab_dir).unwrap();
    let lab = Lab::start(&lab_dir);
    lab.wait_ready();
    let inv = Inventory::parse(&lab.inventory()).unwrap();

    // A whole run.
    let text = std::fs::read_to_string(common::example("line-3.toml")).unwrap();
    let exp = rina_lab::load(&text, None)
        .unwrap()
        .shortened(Duration::from_secs(3));
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut be = Ssh::new(inv.clone());
    be.check().expect("ssh backend usable");
    let out = common::run(&mut be, &exp, &run);
    // The links are the namespaces' (no emulated delay, load not counted
    // over shim-udp); the rest as on local and netns.
    common::check_line_3_links(&out, &run, false);
    // Clocks: one per host, the same clock here.
    let clocks: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("clocks.json")).unwrap()).unwrap();
    let hosts = clocks["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), HOSTS, "{clocks}");
    for h in hosts {
        let off = h["offset_ms"].as_f64().unwrap();
        let rtt = h["rtt_ms"].as_f64().unwrap();
        assert!(
            off.abs() <= rtt / 2.0 + 5.0,
            "offset {off} ms, rtt {rtt} ms"
        );
    }
    assert!(out.timeline.iter().any(|t| t.what.contains("clock offset")));
    // Counters of every node came back; c's normal IPCP is there.
    let ipcps: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("counters/c-ipcps.json")).unwrap()).unwrap();
    assert!(
        ipcps
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["kind"] == "normal" && i["counters"].is_object()),
        "{ipcps}"
    );
    // rinad's log came back over ssh.
    let log = std::fs::read_to_string(run.join("logs/b.log")).unwrap();
    assert!(!log.trim().is_empty(), "empty log of b");
    // Nothing left on the "hosts".
    assert_eq!(run_dirs_left(&lab.remote), Vec::<String>::new());
    let left = processes_with(&format!("{}/run-", lab.remote));
    assert!(left.is_empty(), "left running: {left:?}");

    // Interrupted during the traffic: an error, and nothing left behind.
    let stop = AtomicBool::new(false);
    let progress = |_: f64, what: &str| {
        if what.starts_with("traffic") {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let run2 = dir.join("interrupted");
    std::fs::create_dir_all(&run2).unwrap();
    let ctx = RunCtx {
        dir: &run2,
        progress: &progress,
        stop: &stop,
    };
    let r = Ssh::new(inv.clone()).run_once(&exp, &ctx);
    assert!(matches!(r, Err(LabError::Interrupted)), "{:?}", r.err());
    assert_eq!(run_dirs_left(&lab.remote), Vec::<String>::new());
    // The wrappers stop their programs within a poll (0.2 s) of their
    // session going away; the cleanup killed them already.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_with(&format!("{}/run-", lab.remote));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left running: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The same over shim-eth on veth pairs between the namespaces: link
    // delays are added in rinad and the interfaces count the load, so all
    // of line-3's checks apply.
    let run3 = dir.join("eth");
    std::fs::create_dir_all(&run3).unwrap();
    let inv_eth = Inventory::parse(&lab.inventory_eth()).unwrap();
    let out = common::run(&mut Ssh::new(inv_eth), &exp, &run3);
    common::check_line_3_links(&out, &run3, true);
    let conf = std::fs::read_to_string(run3.join("conf/b.toml")).unwrap();
    assert!(conf.contains("shim-eth"), "{conf}");

    // A remote program whose ssh client dies (rina-lab killed outright)
    // is stopped by its wrapper.
    wrapper_stops_the_program_when_its_session_dies(&lab);
}

fn wrapper_stops_the_program_when_its_session_dies(lab: &Lab) {
    let bin = std::fs::read_dir(&lab.remote)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("bin-"))
        .expect("the binaries' folder stays for later runs");
    let marker = format!("{}/run-watchdog", lab.remote);
    std::fs::create_dir_all(&marker).unwrap();
    let mut ssh = Command::new("ssh")
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
        .args(["-o", "UserKnownHostsFile=/dev/null", "-i"])
        .arg(lab.dir.join("id"))
        .arg(format!("root@{}", lab.addr(0)))
        .arg(format!(
            "exec sh {}/ssh-wrap.sh {marker} sleep 3117",
            bin.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let running = || {
        processes_with("sleep 3117")
            .iter()
            .any(|c| !c.contains("ssh"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running() {
        assert!(Instant::now() < deadline, "remote sleep never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    ssh.kill().unwrap();
    ssh.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while running() {
        assert!(
            Instant::now() < deadline,
            "remote program still running 5 s after its ssh client died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
