//! The IPC Manager at run time, driven by `rinactl` alone (issue 16):
//! two daemons started empty get a shim-udp DIF and a normal DIF over it,
//! one enrolls into the other, `rina-echo` runs across while policies
//! change, the normal IPCP is destroyed under the echo client (which gets
//! an error at once) and a reload brings it back. A bad reload changes
//! nothing and names the key and the line.

mod common;

use common::{name, wait_for, Daemon};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Where the tools are: next to `rinad`, built first if this test runs
/// alone (`cargo test -p rinad` does not build other packages' binaries).
fn tool(exe: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_rinad"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let tools = ["rina-echo", "rinactl"];
    if tools.iter().any(|t| !dir.join(t).exists()) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "rina-tools"]);
        for t in tools {
            cmd.args(["--bin", t]);
        }
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("run cargo").success(),
            "building the tools"
        );
    }
    dir.join(exe)
}

/// `exe ARGS` with `--socket` after the subcommand (`rina-echo client
/// --socket ...`) or before it (`rinactl --socket ... ipcps`).
fn command(d: &Daemon, exe: &str, args: &[&str]) -> Command {
    let mut c = Command::new(tool(exe));
    let (head, tail) = args.split_at(usize::from(exe == "rina-echo"));
    c.args(head).arg("--socket").arg(&d.socket).args(tail);
    c
}

fn run(d: &Daemon, exe: &str, args: &[&str]) -> Output {
    command(d, exe, args)
        .stdin(Stdio::null())
        .output()
        .expect("run a tool")
}

/// `rinactl ARGS` at `d`, which must succeed; its standard output.
fn ctl(d: &Daemon, args: &[&str]) -> String {
    let o = run(d, "rinactl", args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rinactl {args:?} failed: {out}{err}");
    out
}

/// `rinactl ARGS` at `d`, which must fail; its standard error.
fn ctl_fails(d: &Daemon, args: &[&str]) -> String {
    let o = run(d, "rinactl", args);
    assert!(
        !o.status.success(),
        "rinactl {args:?} succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The IPCPs `rinactl ipcps --json` lists: name -> (address, JSON).
fn ipcps(d: &Daemon) -> Vec<serde_json::Value> {
    serde_json::from_str(&ctl(d, &["--json", "ipcps"])).expect("JSON")
}

fn ipcp<'a>(list: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    list.iter().find(|i| i["name"] == name)
}

fn empty(name: &str) -> Daemon {
    Daemon::start_with(name, &format!("[system]\nname = \"{name}\"\n"))
}

fn spawn_echo(d: &Daemon, args: &[&str]) -> Child {
    command(d, "rina-echo", args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rina-echo")
}

/// A short echo run from `d` across DIF net, which must succeed.
fn echo_works(d: &Daemon) {
    let o = run(
        d,
        "rina-echo",
        &[
            "client",
            "--dif",
            "net",
            "--count",
            "3",
            "--interval-ms",
            "20",
        ],
    );
    assert!(
        o.status.success(),
        "rina-echo across: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn rinactl_builds_two_difs_enrolls_changes_policies_destroys_and_reloads() {
    let beta = empty("beta");
    let alpha = empty("alpha");
    let udp = create_beta_difs(&beta);
    create_alpha_ipcps(&alpha, &udp);
    check_enrollment(&alpha);

    let _server = Killed(spawn_echo(&beta, &["server", "--dif", "net"]));
    echo_across(&alpha, "echo to be reachable across");

    // Traffic flows while the policies change.
    let mut client = Killed(spawn_echo(
        &alpha,
        &[
            "client",
            "--dif",
            "net",
            "--count",
            "100000",
            "--interval-ms",
            "10",
        ],
    ));
    change_policies_under_traffic(&alpha, &mut client);

    // Destroying the normal IPCP: the echo client gets an error at once.
    check_destroy_fails_the_client(&alpha, &mut client);

    // A reload of a file that has it brings it back; the shim is kept.
    check_reload_brings_it_back(&alpha, &udp);
}

/// The settings of the normal IPCPs of DIF net, at both systems.
const NET: [&str; 4] = [
    "dif=net",
    "type=normal",
    "routing=link-state",
    "directory_mode=distributed",
];

/// Creates beta's shim-udp IPCP and the bootstrap member of DIF net, with
/// alpha.net as its neighbour; the shim's UDP address.
fn create_beta_difs(beta: &Daemon) -> String {
    // beta: a shim-udp DIF and the bootstrap member of DIF net.
    ctl(
        beta,
        &[
            "ipcp",
            "create",
            "name=beta.udp",
            "type=shim-udp",
            "dif=udp",
            "bind=127.0.0.1:0",
        ],
    );
    let udp = ipcp(&ipcps(beta), "beta.udp").unwrap()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let mut args = vec!["ipcp", "create", "name=beta.net", "address=1"];
    args.extend(NET);
    let out = ctl(beta, &args);
    assert!(out.contains("IPCP beta.net created"), "{out}");
    ctl(
        beta,
        &["neighbor", "add", "beta.net", "alpha.net", "--over", "udp"],
    );
    udp
}

/// Creates alpha's shim-udp IPCP (knowing beta.net at `udp`) and its
/// normal IPCP, with no address yet.
fn create_alpha_ipcps(alpha: &Daemon, udp: &str) {
    // alpha: its shim knows where beta.net is; its normal IPCP has no
    // address and enrolls through beta.net.
    let dir = format!("directory={{\"beta.net\" = \"{udp}\"}}");
    ctl(
        alpha,
        &[
            "ipcp",
            "create",
            "name=alpha.udp",
            "type=shim-udp",
            "dif=udp",
            "bind=127.0.0.1:0",
            &dir,
        ],
    );
    let mut args = vec!["ipcp", "create", "name=alpha.net"];
    args.extend(NET);
    ctl(alpha, &args);
}

/// Enrolls alpha.net through beta.net, checking the progress messages and
/// the address, and that a second enrollment is refused.
fn check_enrollment(alpha: &Daemon) {
    // The steps come as they happen (progress messages before the reply),
    // then the outcome.
    let out = ctl(
        alpha,
        &["ipcp", "enroll", "alpha.net", "beta.net", "--over", "udp"],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 3, "{out}");
    assert!(lines[0].contains("ms: connect (via beta.net)"), "{out}");
    assert!(
        lines[lines.len() - 2].contains("enrolled via beta.net, address"),
        "{out}"
    );
    let last = lines[lines.len() - 1];
    assert!(
        last.starts_with("alpha.net enrolled through beta.net: address "),
        "{out}"
    );
    let addr: u64 = last.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(addr > 1, "{out}");
    let listed = ipcp(&ipcps(alpha), "alpha.net").unwrap()["address"].clone();
    assert_eq!(listed, addr.to_string());
    // A second enrollment of a member is refused with the reason.
    let e = ctl_fails(
        alpha,
        &["ipcp", "enroll", "alpha.net", "beta.net", "--over", "udp"],
    );
    assert!(e.contains("member of DIF net already"), "{e}");
}

/// Waits (naming `what`) until one echo from `alpha` crosses DIF net, then
/// runs a short echo that must succeed.
fn echo_across(alpha: &Daemon, what: &str) {
    wait_for(what, Duration::from_secs(10), || {
        run(
            alpha,
            "rina-echo",
            &["client", "--dif", "net", "--count", "1"],
        )
        .status
        .success()
    });
    echo_works(alpha);
}

/// Waits (at most 10 s) for the echo `client`'s first reply: its flow is
/// up and traffic flows. A thread reads its output on (and drops it).
fn wait_for_first_reply(client: &mut Killed) {
    let out = client.0.stdout.take().expect("the echo client's stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains(" bytes from ") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a first reply to the echo client within 10 s");
}

/// Changes alpha.net's scheduling and EFCP policies (bad ones refused)
/// while the echo `client` runs, which must keep running.
fn change_policies_under_traffic(alpha: &Daemon, client: &mut Killed) {
    wait_for_first_reply(client);
    ctl(
        alpha,
        &[
            "sched",
            "alpha.net",
            "--set",
            "{ policy = \"fifo\", queue_len = 64 }",
        ],
    );
    let s: serde_json::Value =
        serde_json::from_str(&ctl(alpha, &["--json", "sched", "alpha.net"])).unwrap();
    assert_eq!(s["config"]["queue_len"], 64, "{s}");
    let out = ctl(
        alpha,
        &[
            "efcp",
            "alpha.net",
            "reliable",
            "max_retries=5",
            "min_rto_ms=20",
        ],
    );
    assert!(
        out.contains("max_retries=5") && out.contains("min_rto_ms=20"),
        "{out}"
    );
    let e = ctl_fails(alpha, &["efcp", "alpha.net", "reliable", "window=0"]);
    assert!(e.contains("`window` must be between 1 and"), "{e}");
    let e = ctl_fails(alpha, &["efcp", "alpha.net", "reliable", "windw=8"]);
    assert!(e.contains("windw"), "{e}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        client.0.try_wait().unwrap().is_none(),
        "the echo client stopped while policies changed"
    );
}

/// Destroys alpha.net and checks the echo `client` fails at once with
/// "flow closed" and the IPCP is gone.
fn check_destroy_fails_the_client(alpha: &Daemon, client: &mut Killed) {
    let t0 = Instant::now();
    let out = ctl(alpha, &["ipcp", "destroy", "alpha.net"]);
    assert!(out.contains("IPCP alpha.net destroyed"), "{out}");
    assert!(out.contains("application flow(s) closed"), "{out}");
    let status = loop {
        if let Some(s) = client.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the echo client hangs after the destroy"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t0.elapsed();
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(client.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("flow closed"), "{err}");
    eprintln!("echo client failed {took:?} after `rinactl ipcp destroy`");
    assert!(ipcp(&ipcps(alpha), "alpha.net").is_none());
}

/// Reloads alpha from a file that has alpha.net (and the unchanged shim)
/// and checks it comes back, enrolls and carries echoes again.
fn check_reload_brings_it_back(alpha: &Daemon, udp: &str) {
    let file = alpha.dir.join("rinad.toml");
    std::fs::write(
        &file,
        format!(
            "[system]\nname = \"alpha\"\n\n[[ipcp]]\nname = \"alpha.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\ndirectory = {{\"beta.net\" = \"{udp}\"}}\n\n[[ipcp]]\nname = \"alpha.net\"\ntype = \"normal\"\ndif = \"net\"\nrouting = \"link-state\"\ndirectory_mode = \"distributed\"\n[[ipcp.neighbor]]\nname = \"beta.net\"\nover = \"udp\"\n"
        ),
    )
    .unwrap();
    let out = ctl(alpha, &["reload"]);
    assert!(out.contains("IPCP alpha.net created"), "{out}");
    assert!(
        !out.contains("alpha.udp"),
        "the unchanged shim was touched: {out}"
    );
    wait_for("alpha.net to enroll again", Duration::from_secs(10), || {
        ipcp(&ipcps(alpha), "alpha.net").is_some_and(|i| i["address"] != "0")
    });
    echo_across(alpha, "echo across again");
}

#[test]
fn a_bad_reload_changes_nothing_and_names_the_key_and_line() {
    let good = "[system]\nname = \"gamma\"\n\n[[ipcp]]\nname = \"gamma.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
    let d = Daemon::start_with("gamma", good);
    let before = ipcps(&d);
    let file = d.dir.join("rinad.toml");
    // An unknown key on line 9, with a new IPCP before it.
    let bad = format!("{good}\n[[ipcp]]\nbnd = \"x\"\n");
    let bad = bad.replace("[[ipcp]]\nbnd", "[[ipcp]]\nname = \"gamma.net\"\nbnd");
    std::fs::write(&file, &bad).unwrap();
    let line = bad.lines().position(|l| l.starts_with("bnd")).unwrap() + 1;
    let e = ctl_fails(&d, &["reload"]);
    assert!(e.contains("nothing changed"), "{e}");
    assert!(
        e.contains("bnd") && e.contains(&format!("line {line}")),
        "{e}"
    );
    // A bad value: the key and its line.
    let bad = format!("{good}max_sdu = 0\n");
    std::fs::write(&file, &bad).unwrap();
    let e = ctl_fails(&d, &["reload"]);
    assert!(e.contains("max_sdu") && e.contains("line 9"), "{e}");
    assert_eq!(ipcps(&d).len(), before.len());
    assert!(ipcp(&ipcps(&d), "gamma.udp").is_some());
    // A good file by SIGHUP: a second shim appears, the first stays.
    let more = format!(
        "{good}\n[[ipcp]]\nname = \"gamma.udp2\"\ntype = \"shim-udp\"\ndif = \"udp2\"\nbind = \"127.0.0.1:0\"\n"
    );
    std::fs::write(&file, more).unwrap();
    let addr = ipcp(&ipcps(&d), "gamma.udp").unwrap()["address"].clone();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) };
    wait_for("the reload by SIGHUP", Duration::from_secs(5), || {
        ipcp(&ipcps(&d), "gamma.udp2").is_some()
    });
    assert_eq!(ipcp(&ipcps(&d), "gamma.udp").unwrap()["address"], addr);
    // Removing it from the file and reloading destroys it.
    std::fs::write(&file, good).unwrap();
    let out = ctl(&d, &["reload"]);
    assert!(out.contains("IPCP gamma.udp2 destroyed"), "{out}");
    assert!(ipcp(&ipcps(&d), "gamma.udp2").is_none());
    // A relative FILE is the caller's: rinactl run in a directory of its
    // own (the daemon's is elsewhere) reloads the file found there.
    let here = d.dir.join("elsewhere");
    std::fs::create_dir_all(&here).unwrap();
    std::fs::write(
        here.join("other.toml"),
        format!("{good}\n[[ipcp]]\nname = \"gamma.udp3\"\ntype = \"shim-udp\"\ndif = \"udp3\"\nbind = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    let o = command(&d, "rinactl", &["reload", "other.toml"])
        .current_dir(&here)
        .stdin(Stdio::null())
        .output()
        .expect("run rinactl");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("IPCP gamma.udp3 created"), "{out}");
}

/// A file of system `sys`: a shim-udp DIF `udp`, normal DIF `net` over it
/// and normal DIF `top` over `net` (listed first), each IPCP's name
/// prefixed by `prefix`; `net_over` is the DIF under `net`.
fn stacked(sys: &str, prefix: &str, net_over: &str) -> String {
    format!(
        "[system]\nname = \"{sys}\"\n\n\
         [[ipcp]]\nname = \"{prefix}.top\"\ntype = \"normal\"\ndif = \"top\"\naddress = 1\n\
         [[ipcp.neighbor]]\nname = \"x.top\"\nover = \"net\"\n\n\
         [[ipcp]]\nname = \"{prefix}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\
         [[ipcp.neighbor]]\nname = \"x.net\"\nover = \"{net_over}\"\n\n\
         [[ipcp]]\nname = \"{prefix}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n"
    )
}

fn names(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = ipcps(d)
        .iter()
        .map(|i| i["name"].as_str().unwrap_or_default().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn a_reload_creates_a_shim_and_normal_difs_stacked_over_it_and_a_refused_one_changes_nothing() {
    let d = empty("delta");
    let file = d.dir.join("stack.toml");
    std::fs::write(&file, stacked("delta", "d", "udp")).unwrap();
    let out = ctl(&d, &["reload", file.to_str().unwrap()]);
    for n in ["d.udp", "d.net", "d.top"] {
        assert!(out.contains(&format!("IPCP {n} created")), "{out}");
    }
    assert_eq!(names(&d), ["d.net", "d.top", "d.udp"]);
    // Every IPCP renamed and the normal ones stacked in a loop: refused
    // before the old ones are destroyed.
    std::fs::write(&file, stacked("delta", "e", "top")).unwrap();
    let e = ctl_fails(&d, &["reload", file.to_str().unwrap()]);
    assert!(
        e.contains("nothing changed")
            && e.contains("normal IPCPs e.top, e.net are stacked on each other in a loop")
            && e.contains("line 11"),
        "{e}"
    );
    assert_eq!(names(&d), ["d.net", "d.top", "d.udp"]);
    // Renamed without the loop: the old ones go, the new ones come.
    std::fs::write(&file, stacked("delta", "e", "udp")).unwrap();
    let out = ctl(&d, &["reload", file.to_str().unwrap()]);
    assert!(out.contains("IPCP d.top destroyed"), "{out}");
    assert_eq!(names(&d), ["e.net", "e.top", "e.udp"]);
}

#[test]
fn a_reload_that_fails_part_way_says_what_it_changed_before() {
    let shim = |name: &str, bind: &str| {
        format!("\n[[ipcp]]\nname = \"{name}\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"{bind}\"\n")
    };
    let head = "[system]\nname = \"eps\"\n";
    let d = Daemon::start_with("eps", &format!("{head}{}", shim("e.udp", "127.0.0.1:0")));
    // A port another process holds: the file is good, creating its shim fails.
    let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let file = d.dir.join("rinad.toml");
    std::fs::write(
        &file,
        format!("{head}{}", shim("f.udp", &format!("127.0.0.1:{port}"))),
    )
    .unwrap();
    let e = ctl_fails(&d, &["reload"]);
    assert!(
        e.contains("configuration applied only in part")
            && e.contains("IPCP f.udp not created")
            && e.contains(&format!(
                "cannot bind UDP 127.0.0.1:{port}, which another program holds"
            ))
            && e.contains("changed before the failure:\n  IPCP e.udp destroyed"),
        "{e}"
    );
    assert!(names(&d).is_empty(), "{:?}", names(&d));
}

#[test]
fn an_address_wider_than_the_difs_address_field_is_refused_at_run_time() {
    let d = empty("zeta");
    ctl(
        &d,
        &[
            "ipcp",
            "create",
            "name=z.udp",
            "type=shim-udp",
            "dif=udp",
            "bind=127.0.0.1:0",
        ],
    );
    let e = ctl_fails(
        &d,
        &[
            "ipcp",
            "create",
            "name=z.big",
            "type=normal",
            "dif=big",
            "address=70000",
        ],
    );
    assert!(
        e.contains("`address`") && e.contains("at most 65535"),
        "{e}"
    );
    ctl(
        &d,
        &["ipcp", "create", "name=z.net", "type=normal", "dif=net"],
    );
    for args in [
        &[
            "neighbor",
            "add",
            "z.net",
            "y.net",
            "--over",
            "udp",
            "--address",
            "70000",
        ][..],
        &[
            "ipcp",
            "enroll",
            "z.net",
            "y.net",
            "--over",
            "udp",
            "--address",
            "70000",
        ][..],
    ] {
        let e = ctl_fails(&d, args);
        assert!(
            e.contains("--address")
                && e.contains("address 70000 does not fit DIF \"net\"")
                && e.contains("at most 65535"),
            "{args:?}: {e}"
        );
    }
}

/// System `me` at address `addr` with neighbour `peer` (address
/// `peer_addr`) over shim-udp: static addresses, no enrollment.
fn member(me: &str, port: u16, addr: u64, peer: (&str, u16, u64)) -> String {
    let (p, pp, pa) = peer;
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{p}.net\" = \"127.0.0.1:{pp}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n\n[[ipcp.neighbor]]\nname = \"{p}.net\"\nover = \"udp\"\naddress = {pa}\n"
    )
}

#[test]
fn destroying_an_ipcp_answers_the_reads_of_a_neighbours_rib_it_had_under_way() {
    let (pa, pb) = (common::free_port(), common::free_port());
    let a = Daemon::start_with("rra", &member("rra", pa, 1, ("rrb", pb, 2)));
    let b = Daemon::start_with("rrb", &member("rrb", pb, 2, ("rra", pa, 1)));
    wait_for("A to read B's RIB", Duration::from_secs(20), || {
        a.client()
            .read_remote_rib("rra.net", "2", Some("/dt"), None)
            .is_ok()
    });
    // B stops answering: A's next read stays under way...
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(b.child.id() as i32, libc::SIGSTOP) };
    let path = a.socket.clone();
    let reader = std::thread::spawn(move || {
        let mut c = rina::Client::connect_to(path).unwrap();
        c.set_timeout(Some(Duration::from_secs(20)));
        let r = c.read_remote_rib("rra.net", "2", Some("/"), None);
        (r, Instant::now())
    });
    wait_for("the read to be under way", Duration::from_secs(10), || {
        ctl(&a, &["rib", "rra.net", "/difm/cdap/sessions"]).contains("outstanding 1")
    });
    // ...until its IPCP is destroyed: the reader hears so at once, not
    // after its own timeout (the machine that would answer is gone).
    ctl(&a, &["ipcp", "destroy", "rra.net"]);
    let destroyed = Instant::now();
    let (r, answered) = reader.join().unwrap();
    let e = r.expect_err("the read cannot complete");
    assert!(
        answered.saturating_duration_since(destroyed) < Duration::from_secs(2),
        "answered {:?} after the destroy: {e}",
        answered.saturating_duration_since(destroyed)
    );
    assert!(e.to_string().contains("IPCP rra.net was destroyed"), "{e}");
    // SAFETY: as above.
    unsafe { libc::kill(b.child.id() as i32, libc::SIGCONT) };
}

#[test]
fn a_destroyed_ipcp_is_no_longer_found_by_any_command() {
    let d = empty("eta");
    ctl(
        &d,
        &[
            "ipcp",
            "create",
            "name=h.net",
            "type=normal",
            "dif=net",
            "address=1",
        ],
    );
    ctl(
        &d,
        &[
            "ipcp",
            "create",
            "name=h.udp",
            "type=shim-udp",
            "dif=udp",
            "bind=127.0.0.1:0",
        ],
    );
    ctl(&d, &["ipcp", "destroy", "h.net"]);
    // The destroyed IPCP's slot has no name: neither "" nor its old name
    // may reach it, and listings of names do not show an empty one.
    for name in ["", "h.net"] {
        for args in [
            &["rib", name][..],
            &["rib", name, "--remote", "2"][..],
            &["sched", name][..],
            &["neighbor", "add", name, "x.net", "--over", "udp"][..],
            &["register-ipcp", name, "udp"][..],
            &["capture", name, "/dev/null", "-c", "1"][..],
        ] {
            let e = ctl_fails(&d, args);
            assert!(
                e.contains(&format!("no IPCP named {name:?}; this system has h.udp\n")),
                "{args:?}: {e}"
            );
        }
    }
}

#[test]
fn a_reload_names_the_keys_that_make_an_ipcp_be_created_again() {
    let file = |max_sdu: u32| {
        format!("[system]\nname = \"kappa\"\n\n[[ipcp]]\nname = \"k.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\nmax_sdu = {max_sdu}\n")
    };
    let d = Daemon::start_with("kappa", &file(1400));
    std::fs::write(d.dir.join("rinad.toml"), file(1300)).unwrap();
    let out = ctl(&d, &["reload"]);
    assert!(
        out.contains("IPCP k.udp changed (max_sdu): created again"),
        "{out}"
    );
    assert_eq!(ctl(&d, &["reload"]).trim(), "nothing changed");
}

/// A reload that changes a DIF's access rules or the RIB its members may
/// read changes them in place: the IPCP is not created again (the names
/// registered stay), and new registrations are judged by the new rules.
#[test]
fn a_reload_changes_access_rules_and_the_readable_rib_in_place() {
    let file = |extra: &str| {
        format!("[system]\nname = \"lambda\"\n\n[[ipcp]]\nname = \"l.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n{extra}")
    };
    let d = Daemon::start_with("lambda", &file(""));
    let mut early = d.client();
    early.register(&name("early"), Some("net")).unwrap();
    let rules = "rib_readable = [\"/ra\"]\n\n[ipcp.access]\nregister = [\"echo*\"]\n";
    std::fs::write(d.dir.join("rinad.toml"), file(rules)).unwrap();
    let out = ctl(&d, &["reload"]);
    assert!(out.contains("l.net: access rules changed"), "{out}");
    assert!(
        out.contains("l.net: RIB readable by members now /ra"),
        "{out}"
    );
    assert!(!out.contains("created again"), "{out}");
    let names = d.client().list_names().unwrap();
    assert!(names.iter().any(|n| n.name == name("early")), "{names:?}");
    let err = d
        .client()
        .register(&name("late"), Some("net"))
        .expect_err("the new rules let only echo* register");
    assert!(err.to_string().contains("access rules"), "{err}");
    d.client().register(&name("echo1"), Some("net")).unwrap();
    assert_eq!(ctl(&d, &["reload"]).trim(), "nothing changed");
}

#[test]
fn destroying_an_ipcp_ends_its_captures() {
    let cfg = "[system]\nname = \"cad\"\n\n[[ipcp]]\nname = \"cad.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n\n[[ipcp]]\nname = \"cad2.udp\"\ntype = \"shim-udp\"\ndif = \"udp2\"\nbind = \"127.0.0.1:0\"\n";
    let d = Daemon::start_with("cad", cfg);
    let mut c = d.client();
    let (_, _, gone) = c.capture("cad.udp", None).unwrap();
    let (_, _, kept) = c.capture("cad2.udp", None).unwrap();
    c.destroy_ipcp("cad.udp").unwrap();
    // The reader of the destroyed IPCP's capture reads end of file; the
    // other capture goes on.
    let hung_up = |fd: &std::os::fd::OwnedFd, ms: i32| {
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(fd),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n == 1 && p.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0
    };
    assert!(hung_up(&gone, 3000), "the capture of cad.udp goes on");
    assert!(!hung_up(&kept, 200), "the capture of cad2.udp ended");
}

#[test]
fn a_reload_with_a_bad_efcp_table_is_refused_before_anything_changes() {
    let base = "[system]\nname = \"rld\"\n\n[[ipcp]]\nname = \"rld.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n\n[ipcp.directory]\n\"x.net\" = \"127.0.0.1:9\"\n\n[[ipcp]]\nname = \"rld.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\n[ipcp.names]\n\"echo\" = 7\n\n[[ipcp.qos_cube]]\nid = 1\nname = \"unreliable\"\n\n[[ipcp.qos_cube]]\nid = 2\nname = \"reliable\"\nreliable = true\n";
    let d = Daemon::start_with("rld", base);
    let file = d.dir.join("rinad.toml");
    // A directory entry gone, and a reliable cube whose min_rto_ms (2000)
    // exceeds its initial RTO (1000 ms): each key in range, not together.
    let bad = base.replace("\n[ipcp.names]\n\"echo\" = 7\n", "") + "efcp = { min_rto_ms = 2000 }\n";
    std::fs::write(&file, &bad).unwrap();
    let line = bad.lines().position(|l| l.starts_with("efcp")).unwrap() + 1;
    let e = ctl_fails(&d, &["reload"]);
    assert!(
        e.contains("nothing changed")
            && e.contains(&format!("line {line}"))
            && e.contains("ipcp[1].qos_cube[1].efcp")
            && e.contains("min_rto <= initial_rto"),
        "{e}"
    );
    // The directory entry and the cube are as they were: the first file
    // again is no change, and the cube keeps its RTO bounds.
    std::fs::write(&file, base).unwrap();
    assert_eq!(ctl(&d, &["reload"]).trim(), "nothing changed");
    let out = ctl(&d, &["efcp", "rld.net", "reliable", "ack_every=2"]);
    assert!(out.contains("initial_rto_ms=1000 min_rto_ms=10 "), "{out}");
}
