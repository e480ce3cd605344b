//! N-1 flows that fail, and neighbours removed while a claim waits.

use super::*;

/// Flows of member `m` of system `i` (a normal IPCP).
fn member_flows(net: &Net, i: usize, m: usize) -> Vec<PortId> {
    net.sys[i]
        .member(m)
        .and_then(|m| m.normal())
        .unwrap()
        .flows()
        .map(|(f, _)| f)
        .collect()
}

#[test]
fn a_failed_stacked_n1_flow_is_deallocated_in_the_dif_below() {
    const PW: &str = "pw";
    let mut net = Net::new(vec![
        stacked_slow_up(
            0,
            &[(1, "s1.low")],
            ("s0.low", 1),
            ("s0.up", 1),
            "s1.up",
            PW,
        ),
        stacked_slow_up(
            1,
            &[(0, "s0.low")],
            ("s1.low", 2),
            ("s1.up", 2),
            "s0.up",
            PW,
        ),
    ]);
    net.run_until(ms(6000));
    for _ in 0..3 {
        // The lower DIF's link is cut for 15 s: its route to s1 is gone
        // for more than 6 s, so the upper's N-1 flows there fail
        // (FlowFailed); then it comes back and new N-1 flows are set up.
        net.mute.insert(0);
        net.mute.insert(1);
        let t = net.now;
        net.run_until(t + Duration::from_secs(15));
        net.mute.clear();
        net.run_until(t + Duration::from_secs(30));
    }
    let n1_over_low: BTreeSet<PortId> = net.sys[0]
        .n1_flows()
        .filter(|f| f.2 == 1)
        .map(|f| f.0)
        .collect();
    let low: BTreeSet<PortId> = member_flows(&net, 0, 1).into_iter().collect();
    assert_eq!(n1_over_low.len(), 2, "primary and lane are up again");
    // Every flow of the lower IPCP is an N-1 flow of the upper one (there
    // are no application flows): nothing is left over from the outages.
    assert_eq!(low, n1_over_low, "flows left open in DIF low");
}

/// [`stacked_system`] whose upper DIF takes a neighbour down only after
/// 60 s of silence (its `dead_interval`), so that an outage of the lower
/// DIF fails the upper's N-1 flows there first (no route for 6 s).
fn stacked_slow_up(
    i: usize,
    peers: &[(usize, &str)],
    low: (&str, u64),
    up: (&str, u64),
    up_peer: &str,
    password: &str,
) -> System {
    stacked_system_tuned(i, peers, low, up, (up_peer, password), |m| {
        m.dead_interval = Duration::from_secs(60)
    })
}

#[test]
fn a_claim_survives_the_removal_of_another_neighbour() {
    const PW: &str = "the DIF's password";
    let mut net = Net::new(vec![
        member_system(0, "s0.net", 1, PW, &[(1, "s1.net")]),
        // s1's neighbours: s2.net (k = 0), then s0.net (k = 1).
        member_system(1, "s1.net", 2, PW, &[(2, "s2.net"), (0, "s0.net")]),
        member_system(2, "s2.net", 3, PW, &[(1, "s1.net")]),
        System::new("idle"),
    ]);
    net.run_until(ms(3000));
    assert_eq!(net.sys[1].n1_flows().count(), 2);
    // s0 comes back from another address (slot 3); the old one is gone.
    net.mute.insert(0);
    net.sys[3] = member_system(3, "s0.net", 1, PW, &[(1, "s1.net")]);
    let mut t = net.now;
    while net.sys[1].claims.is_empty() {
        t = t + Duration::from_millis(1);
        net.run_until(t);
        assert!(t < ms(10_000), "no claim");
    }
    // The operator removes neighbour s2.net (k = 0) meanwhile: s0.net is
    // now k = 0, but the claim still says k = 1.
    assert!(net.sys[1].remove_neighbor(net.now, 1, &name("s2.net")));
    // The claimant authenticates: panics (index out of bounds) in
    // settle_claims.
    net.run_until(ms(20_000));
    assert!(net.sys[1].counters().n1_claims_admitted >= 1);
    assert!(net.sys[1].claims.is_empty());
    assert_eq!(net.sys[1].n1_flows().count(), 1);
}

/// Removing the lower normal IPCP under a stacked DIF tells the peer: the
/// upper DIF's N-1 flows over it are deallocated there, at once, while the
/// lower IPCP's own N-1 flows below still carry the news.
#[test]
fn removing_the_ipcp_under_a_stacked_dif_deallocates_its_upper_flows_at_the_peer() {
    let mut net = stacked_pair();
    let before = member_flows(&net, 1, 1);
    assert!(!before.is_empty(), "the upper DIF's N-1 flows are up");
    let t = net.now;
    let r = net.sys[0].remove_ipcp(t, 1).unwrap();
    assert!(!r.n1_above.is_empty(), "{r:?}");
    net.run_until(t + Duration::from_millis(200));
    assert_eq!(
        member_flows(&net, 1, 1),
        Vec::<PortId>::new(),
        "flows of s1.low left open 200 ms after its peer went"
    );
    assert_eq!(net.sys[1].n1_flows().filter(|f| f.2 == 1).count(), 0);
}
