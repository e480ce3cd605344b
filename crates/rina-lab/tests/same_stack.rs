//! A sim run and a real run of the same experiment configure the same
//! stack: for every example (every variant), the `rinad` configuration
//! the real backends write, read by `rinad`'s own configuration code,
//! gives every normal IPCP the machine configuration the simulator builds
//! its member from, and every shim-udp the same largest SDU and pacing.

use rina_lab::backend::real::config::{node_config, ShimApps, ShimKind};
use rina_lab::backend::stack;
use rina_lab::resolve::Experiment;
use rinad::config::{Config, IpcpKind};
use std::path::Path;

#[path = "real_common/mod.rs"]
mod common;

fn examples() -> Vec<Experiment> {
    common::every_example()
        .into_iter()
        .map(|(_, _, e)| e)
        .collect()
}

#[test]
fn rinad_reads_the_real_config_as_the_stack_the_simulator_builds() {
    let udp = |l: usize| ShimKind::Udp {
        bind: ([127, 0, 0, 1], 7000 + 2 * l as u16).into(),
        peer: ([127, 0, 0, 1], 7001 + 2 * l as u16).into(),
    };
    let exps = examples();
    assert!(exps.len() >= 10, "{} experiments", exps.len());
    let mut normals = 0;
    let mut paced = 0;
    for exp in &exps {
        for n in 0..exp.nodes.len() {
            let text = node_config(exp, n, Path::new("/tmp/x.sock"), &udp, &ShimApps::new());
            let cfg = Config::parse(Path::new("generated.toml"), &text)
                .unwrap_or_else(|e| panic!("{} node {n}: {e}\n{text}", exp.name));
            for ic in &cfg.ipcps {
                let at = format!("{} {:?} {}", exp.name, exp.variant, ic.name.get_ref());
                match ic.kind {
                    IpcpKind::Normal => {
                        let d = exp.difs.iter().position(|d| d.name == ic.dif).unwrap();
                        let sim = stack::member_config(exp, n, d, &|_| stack::LINK_MTU);
                        let real = ic.normal_config();
                        assert_eq!(real.address, sim.address, "{at}");
                        assert_eq!(real.dt, sim.dt, "{at}");
                        assert_eq!(real.sdup, sim.sdup, "{at}");
                        assert_eq!(real.max_sdu, sim.max_sdu, "{at}");
                        assert_eq!(real.cubes, sim.cubes, "{at}");
                        assert_eq!(real.ecn, sim.ecn, "{at}");
                        assert_eq!(real.routing.is_some(), sim.routing.is_some(), "{at}");
                        assert_eq!(
                            real.dynamic_directory.is_some(),
                            sim.dynamic_directory.is_some(),
                            "{at}"
                        );
                        assert_eq!(ic.scheduler_config(), exp.difs[d].scheduler, "{at}");
                        normals += 1;
                    }
                    IpcpKind::ShimUdp => {
                        let l = exp.links.iter().position(|l| l.name == ic.dif).unwrap();
                        let max = ic.max_sdu.as_ref().map(|m| *m.get_ref() as usize);
                        assert_eq!(max, Some(stack::LINK_MTU), "{at}");
                        assert_eq!(ic.port_rate(), stack::udp_port_rate(&exp.links[l]), "{at}");
                        paced += usize::from(ic.port_rate().is_some());
                    }
                    _ => panic!("{at}: unexpected kind"),
                }
            }
        }
    }
    assert!(
        normals > 100 && paced > 10,
        "{normals} normal IPCPs, {paced} paced shims"
    );
}
