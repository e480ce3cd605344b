//! Cube mapping across DIFs in real `rinad` processes (seed 003): two
//! systems, a shim DIF over UDP, an MR DIF with cubes A1, A2, B1, B2 over
//! it, and an SPN DIF with Gold, Silver, Sensitive BE, Bronze and BE over
//! that, Gold and Silver mapped to A1, Sensitive BE to A2, Bronze to B1 and
//! BE to B2. The SPN IPCPs set up one N-1 flow per lower cube and each
//! upper cube's PDUs are seen on the N-1 flow of the lower cube it maps to.

mod common;

use common::free_port;

use common::{name, wait_for, Daemon};
use rina::QosSpec;
use std::collections::BTreeMap;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// The upper cubes: (id, name, lower cube, SDUs sent on its flow).
const SPN: [(u64, &str, &str, usize); 5] = [
    (1, "gold", "A1", 7),
    (2, "silver", "A1", 11),
    (3, "sensitive-be", "A2", 13),
    (4, "bronze", "B1", 17),
    (5, "be", "B2", 19),
];

fn system(me: &str, addr: u64, port: u16, peer: &str, peer_addr: u64, peer_port: u16) -> String {
    system_with(
        me, addr, port, peer, peer_addr, peer_port, true, false, "A1",
    )
}

/// A system; `bootstrap`: its MR IPCP has an address and the cubes (else it
/// enrolls and learns them); `learn`: its MR neighbours are learnt from
/// hellos and routed by link-state routing; `gold`: the MR cube Gold is
/// mapped to.
#[allow(clippy::too_many_arguments)]
fn system_with(
    me: &str,
    addr: u64,
    port: u16,
    peer: &str,
    peer_addr: u64,
    peer_port: u16,
    bootstrap: bool,
    learn: bool,
    gold: &str,
) -> String {
    let (mr_routing, mr_neighbor) = if learn {
        ("routing = \"link-state\"".to_string(), String::new())
    } else {
        (String::new(), format!("address = {peer_addr}"))
    };
    let mr_addr = if bootstrap {
        format!("address = {addr}")
    } else {
        String::new()
    };
    let mut s = format!(
        r#"[system]
name = "{me}"

[[ipcp]]
name = "{me}.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:{port}"

[ipcp.directory]
"{peer}.mr" = "127.0.0.1:{peer_port}"

[[ipcp]]
name = "{me}.mr"
type = "normal"
dif = "mr"
{mr_addr}
{mr_routing}

[[ipcp.neighbor]]
name = "{peer}.mr"
over = "udp"
{mr_neighbor}

[ipcp.names]
"{peer}.spn" = {peer_addr}
"#
    );
    let cubes = [
        (1, "A1", 0, 0),
        (2, "A2", 0, 1),
        (3, "B1", 1, 0),
        (4, "B2", 1, 1),
    ];
    for (id, n, u, c) in cubes.into_iter().filter(|_| bootstrap) {
        s += &format!(
            "\n[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nurgency = {u}\ncherish = {c}\n"
        );
    }
    s += &format!(
        r#"
[[ipcp]]
name = "{me}.spn"
type = "normal"
dif = "spn"
address = {addr}

[[ipcp.neighbor]]
name = "{peer}.spn"
over = "mr"
address = {peer_addr}

[ipcp.names]
"echo" = 2
"#
    );
    for (id, n, lower, _) in SPN {
        let lower = if id == 1 { gold } else { lower };
        s += &format!(
            "\n[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nlower = {{ mr = \"{lower}\" }}\n"
        );
    }
    s
}

/// Per lower cube name, the PDUs the SPN IPCP `ipcp` sent on its N-1 flow
/// of that cube, from `/rmt/n1flows` of its RIB.
fn sent_per_lower_cube(d: &Daemon, ipcp: &str) -> BTreeMap<String, u64> {
    // Before the first N-1 flow the object does not exist.
    let objs = d
        .client()
        .read_rib(ipcp, Some("/rmt/n1flows"), None)
        .unwrap_or_default();
    let mut m = BTreeMap::new();
    for o in objs {
        let v = &o.value;
        let Some(rest) = v.split("lower cube ").nth(1) else {
            continue;
        };
        let cube = rest.split(' ').next().unwrap().to_string();
        let sent: u64 = v
            .split("sent ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no sent counter in {v:?}"));
        m.insert(cube, sent);
    }
    m
}

#[test]
fn upper_cubes_ride_on_the_lower_cubes_seed_003_maps_them_to() {
    let (pa, pb) = (free_port(), free_port());
    let alpha = Daemon::start_with("alpha", &system("alpha", 1, pa, "beta", 2, pb));
    let beta = Daemon::start_with("beta", &system("beta", 2, pb, "alpha", 1, pa));
    let four = ["A1", "A2", "B1", "B2"].map(String::from).to_vec();
    wait_for("one SPN N-1 flow per MR cube on both sides", T, || {
        [(&alpha, "alpha.spn"), (&beta, "beta.spn")]
            .iter()
            .all(|(d, i)| sent_per_lower_cube(d, i).into_keys().collect::<Vec<_>>() == four)
    });
    // The neighbour's listing shows the primary (A1) and its lanes.
    let neighs = alpha
        .client()
        .read_rib("alpha.spn", Some("/difm/enr/neighs"), None)
        .unwrap();
    let text: Vec<&str> = neighs.iter().map(|o| o.value.as_str()).collect();
    assert!(
        text.iter().any(|v| v.contains("(cube A1), lanes")
            && v.contains("(cube A2)")
            && v.contains("(cube B1)")
            && v.contains("(cube B2)")),
        "{text:?}"
    );

    let mut srv = beta.client();
    srv.register(&name("echo"), Some("spn")).unwrap();
    let server = std::thread::spawn(move || {
        let mut flows = Vec::new();
        for _ in 0..SPN.len() {
            let req = srv.next_request_timeout(T).unwrap().unwrap();
            let flow = srv.accept(&req).unwrap();
            flows.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 2048];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            }));
        }
        srv
    });
    let before_a = sent_per_lower_cube(&alpha, "alpha.spn");
    let before_b = sent_per_lower_cube(&beta, "beta.spn");
    let mut c = alpha.client();
    let mut buf = vec![0u8; 2048];
    for (id, cube, _, n) in SPN {
        let qos = QosSpec {
            cube: Some(id),
            ..Default::default()
        };
        let flow = c
            .allocate(&name("perf"), &name("echo"), Some("spn"), &qos)
            .unwrap_or_else(|e| panic!("allocating a {cube} flow: {e}"));
        for k in 0..n {
            let sdu = format!("{cube} {k}");
            flow.write(sdu.as_bytes()).unwrap();
            // One at a time: nothing is lost on loopback, so the counts
            // below are exact.
            let got = flow.read_timeout(&mut buf, T).unwrap().expect("echo");
            assert_eq!(&buf[..got], sdu.as_bytes());
        }
    }
    let sent = |d: &Daemon, i: &str, before: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        sent_per_lower_cube(d, i)
            .into_iter()
            .map(|(k, v)| {
                let b = before[&k];
                (k, v - b)
            })
            .collect()
    };
    let per = |lower: &str| -> u64 {
        SPN.iter()
            .filter(|c| c.2 == lower)
            .map(|c| c.3 as u64)
            .sum()
    };
    for (d, i, before) in [
        (&alpha, "alpha.spn", &before_a),
        (&beta, "beta.spn", &before_b),
    ] {
        let s = sent(d, i, before);
        eprintln!("{i}: PDUs per lower cube while testing: {s:?}");
        // The lanes carry exactly their upper cubes' data PDUs; A1 carries
        // Gold and Silver plus management (hellos, flow allocation).
        for lower in ["A2", "B1", "B2"] {
            assert_eq!(s[lower], per(lower), "{i}: lower cube {lower}");
        }
        assert!(s["A1"] >= per("A1"), "{i}: A1 {s:?}");
    }
    drop(c);
    drop(server);
}

#[test]
fn a_mapping_to_a_cube_the_dif_below_lacks_stops_the_n1_flows_with_a_clear_error() {
    // Alpha's MR IPCP enrolls, so its cubes are only known at run time: the
    // file cannot be checked, the N-1 allocation can.
    let (pa, pb) = (free_port(), free_port());
    let alpha = Daemon::start_with(
        "alpha",
        &system_with("alpha", 1, pa, "beta", 2, pb, false, true, "C1"),
    );
    let beta = Daemon::start_with(
        "beta",
        &system_with("beta", 2, pb, "alpha", 1, pa, true, true, "A1"),
    );
    let want = "QoS cube gold (1) maps to cube \"C1\" of DIF mr, which offers A1 (1), A2 (2), B1 (3), B2 (4)";
    wait_for("the mapping error in alpha's log", T, || {
        alpha.log().contains(want)
    });
    assert!(alpha.log().contains("bad QoS cube mapping"));
    assert!(sent_per_lower_cube(&alpha, "alpha.spn").is_empty());
    assert!(sent_per_lower_cube(&beta, "beta.spn").is_empty());
}
