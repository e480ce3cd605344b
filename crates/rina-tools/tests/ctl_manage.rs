//! `rinactl` commands that change the running system: neighbours of normal
//! IPCPs added and removed live, IPCP registrations in lower DIFs, flows
//! stopped, names withdrawn; with `--json` and refusals that say why.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
use rina::{Client, QosSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

/// A system with a normal IPCP and no neighbour in its file.
fn config(me: &str, addr: u64, port: u16, peer: &str, peer_port: u16) -> String {
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\nmax_sdu = 9100\n\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

struct Ctl {
    bin: PathBuf,
    sock: String,
}

impl Ctl {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .args(["--socket", &self.sock, "--json"])
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; its JSON.
    fn ok(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Runs a command that must be refused; the error's kind and message.
    fn refused(&self, args: &[&str]) -> (String, String) {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?} was not refused");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let e = &v["error"];
        (
            e["kind"].as_str().unwrap().to_string(),
            e["message"].as_str().unwrap().to_string(),
        )
    }

    fn neighbors_up(&self) -> u64 {
        let v = self.ok(&["ipcps"]);
        v.as_array()
            .unwrap()
            .iter()
            .find(|i| i["kind"] == "normal")
            .map_or(0, |i| i["counters"]["neighbors_up"].as_u64().unwrap_or(0))
    }
}

fn start(dir: &Path, me: &str, cfg: String, procs: &mut Procs) -> String {
    let conf = dir.join(format!("{me}.toml"));
    std::fs::write(&conf, cfg).unwrap();
    let sock = dir.join(format!("{me}.sock"));
    procs.0.push(spawn_rinad(&bin_dir(), &conf, &sock));
    wait_until("rinad to answer", T, || Client::connect_to(&sock).is_ok());
    sock.to_str().unwrap().to_string()
}

#[test]
fn rinactl_adds_and_removes_neighbours_and_stops_flows() {
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-tools-ctl-manage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    let sa = start(
        &dir,
        "alpha",
        config("alpha", 1, pa, "beta", pb),
        &mut procs,
    );
    let sb = start(&dir, "beta", config("beta", 2, pb, "alpha", pa), &mut procs);
    let (a, b) = (
        Ctl {
            bin: bins.join("rinactl"),
            sock: sa.clone(),
        },
        Ctl {
            bin: bins.join("rinactl"),
            sock: sb.clone(),
        },
    );

    // Refusals say what and why.
    let (k, m) = a.refused(&["register-ipcp", "alpha.net", "nosuch"]);
    assert_eq!(k, "invalid_request");
    assert!(m.contains("no DIF \"nosuch\""), "{m}");
    let (k, m) = a.refused(&["neighbor", "remove", "alpha.net", "beta.net"]);
    assert_eq!(k, "invalid_request");
    assert!(m.contains("not a neighbour"), "{m}");
    let (k, m) = a.refused(&["neighbor", "add", "alpha.udp", "x", "--over", "udp"]);
    assert_eq!(k, "invalid_request");
    assert!(m.contains("shim-udp IPCP"), "{m}");
    let (k, _) = a.refused(&["dealloc", "999"]);
    assert_eq!(k, "unknown_flow");

    // Neighbours added live: the N-1 flow comes up and carries flows.
    let v = a.ok(&[
        "neighbor",
        "add",
        "alpha.net",
        "beta.net",
        "--over",
        "udp",
        "--address",
        "2",
    ]);
    assert_eq!(v["detail"]["neighbor"], "beta.net", "{v}");
    let v = b.ok(&["register-ipcp", "beta.net", "udp"]);
    assert_eq!(v["detail"]["dif"], "udp", "{v}");
    b.ok(&[
        "neighbor",
        "add",
        "beta.net",
        "alpha.net",
        "--over",
        "udp",
        "--address",
        "1",
    ]);
    let (k, m) = a.refused(&["neighbor", "add", "alpha.net", "beta.net", "--over", "udp"]);
    assert_eq!(k, "invalid_request");
    assert!(m.contains("already a neighbour"), "{m}");
    wait_until("the N-1 flow", T, || {
        a.neighbors_up() == 1 && b.neighbors_up() == 1
    });

    let mut srv = Client::connect_to(&sb).unwrap();
    srv.register(&"echo".parse().unwrap(), Some("net")).unwrap();
    let server = std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        (srv, flow)
    });
    let mut c = Client::connect_to(&sa).unwrap();
    let flow = c
        .allocate(
            &"me".parse().unwrap(),
            &"echo".parse().unwrap(),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    let (mut srv, _theirs) = server.join().unwrap();

    // Flows stopped and names withdrawn from the command line.
    let port = flow.info().port.to_string();
    let v = a.ok(&["dealloc", &port]);
    assert_eq!(v["done"], format!("flow {port} deallocated"), "{v}");
    assert_eq!(a.ok(&["flows"]).as_array().unwrap().len(), 0);
    b.ok(&["unregister", "echo"]);
    // The server that registered it hears of it, instead of waiting for
    // requests that will not come.
    let e = srv.next_request_timeout(T).unwrap_err();
    assert_eq!(e.kind(), rina::ErrorKind::NotRegistered, "{e}");
    assert!(e.to_string().contains("unregistered echo from net"), "{e}");
    // What is left is beta.net's own registration in the shim DIF.
    let names = b.ok(&["names"]);
    let left: Vec<&str> = names
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["beta.net"], "{names}");

    // Removing the neighbour takes its N-1 flow down.
    a.ok(&["neighbor", "remove", "alpha.net", "beta.net"]);
    wait_until("the N-1 flow to go", T, || a.neighbors_up() == 0);
    b.ok(&["unregister-ipcp", "beta.net", "udp"]);
    assert!(b.ok(&["names"]).as_array().unwrap().is_empty());
    let (k, m) = b.refused(&["unregister-ipcp", "beta.net", "udp"]);
    assert_eq!(k, "invalid_request");
    assert!(m.contains("not registered"), "{m}");
}
