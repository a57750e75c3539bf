//! RedisCluster against real nodes, with whatever backend the environment
//! chooses. Every test name contains `cluster` (`cargo xtask test-cluster`
//! runs them; `test-redis` skips them).

use std::time::{Duration, Instant};

use rate_tier_test_support::{
    ClusterNode, ClusterSpec, RedisCluster, RedisServer, SHARED_REDIS_PORT,
};

/// A key whose slot master `master` serves, found by asking the cluster.
fn key_served_by(cluster: &RedisCluster, master: usize) -> String {
    let node = &cluster.nodes()[cluster.master_index(master)];
    let topology = cluster.topology().unwrap();
    let owner = topology.iter().find(|n| n.port == node.port()).unwrap();
    (0..10_000)
        .map(|i| format!("key-{i}"))
        .find(|key| {
            let slot: u16 = node
                .command(&["CLUSTER", "KEYSLOT", key])
                .unwrap()
                .parse()
                .unwrap();
            owner.slots.iter().any(|range| range.contains(&slot))
        })
        .expect("some key hashes to each master")
}

#[test]
fn cluster_fails_over_to_the_replica_after_kill_master_and_the_old_master_rejoins()
 {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    eprintln!(
        "3+3 cluster ({}) up in {:?}",
        cluster.nodes()[0].backend(),
        started.elapsed()
    );
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    let topology = cluster.topology().unwrap();
    assert_eq!(topology.iter().filter(|n| n.master).count(), 3);
    assert!(
        topology
            .iter()
            .all(|n| n.port != SHARED_REDIS_PORT && !n.failed)
    );

    // A key on master 0, written there and replicated before the kill. WAIT
    // counts the replicas that acknowledged the writes of its own
    // connection: it must follow the SET on the same one (on a connection of
    // its own it waits for nothing, and a replica just put online after its
    // full sync answers it before it has been sent the SET).
    let key = key_served_by(&cluster, 0);
    let master = &cluster.nodes()[cluster.master_index(0)];
    let master_id = topology
        .iter()
        .find(|n| n.port == master.port())
        .unwrap()
        .id
        .clone();
    let replica = topology
        .iter()
        .find(|n| n.master_id.as_deref() == Some(master_id.as_str()))
        .unwrap_or_else(|| panic!("master 0 has no replica: {topology:?}"))
        .port;
    let replies = master
        .commands(
            &[&["SET", &key, "kept"], &["WAIT", "1", "5000"]],
            Duration::from_secs(6),
        )
        .unwrap();
    assert_eq!(replies, ["OK", "1"], "SET, then WAIT 1 on its connection");

    let killed = cluster.kill_master(0);
    assert!(!cluster.nodes()[killed.node].is_running());
    assert!(killed.slots.iter().any(|range| range.contains(&0)));
    let failover = cluster.wait_for_failover(&killed);
    eprintln!(
        "failover to 127.0.0.1:{} seen {:?} after the kill",
        failover.new_master, failover.waited
    );
    assert_ne!(failover.new_master, killed.port);
    assert_eq!(
        failover.new_master, replica,
        "the replica that acknowledged"
    );
    assert!(
        failover.waited < Duration::from_secs(15),
        "{:?}",
        failover.waited
    );
    let promoted = &cluster.nodes()[cluster.master_index(0)];
    assert_eq!(promoted.port(), failover.new_master);
    assert_eq!(promoted.command(&["GET", &key]).unwrap(), "kept");

    // The old master comes back as a replica of the one that took over.
    cluster.node_mut(killed.node).restart();
    cluster.wait_until_ok();
    let topology = cluster.topology().unwrap();
    let back = topology.iter().find(|n| n.port == killed.port).unwrap();
    assert!(!back.master && !back.failed, "{back:?}");
    assert_eq!(back.master_id.as_deref(), Some(id_of(&topology, replica)));
    assert_eq!(topology.iter().filter(|n| n.master).count(), 3);
    // It restarted empty (nothing is saved) and did not take the key away:
    // the new master still has it, and the old one got it back from it.
    let promoted = &cluster.nodes()[cluster.master_index(0)];
    assert_eq!(promoted.port(), replica);
    assert_eq!(promoted.command(&["GET", &key]).unwrap(), "kept");
    let rejoined = &cluster.nodes()[killed.node];
    let replies = rejoined
        .commands(&[&["READONLY"], &["GET", &key]], Duration::from_secs(1))
        .unwrap();
    assert_eq!(replies, ["OK", "kept"], "the rejoined old master's copy");
}

/// The id of the node on `port`.
fn id_of(topology: &[ClusterNode], port: u16) -> &str {
    &topology.iter().find(|n| n.port == port).unwrap().id
}

#[test]
fn cluster_without_full_coverage_keeps_serving_the_other_masters_while_one_is_down()
 {
    let mut cluster = ClusterSpec::new(3, 0).start();
    let key = key_served_by(&cluster, 1);
    let healthy: &RedisServer = &cluster.nodes()[cluster.master_index(1)];
    let healthy_port = healthy.port();
    cluster.kill_master(0);
    // Past the node timeout the dead master is failed, and the others still
    // answer for their own slots.
    std::thread::sleep(Duration::from_millis(2500));
    let healthy = cluster
        .nodes()
        .iter()
        .find(|n| n.port() == healthy_port)
        .unwrap();
    assert_eq!(healthy.command(&["SET", &key, "v"]).unwrap(), "OK");
}

#[test]
fn cluster_of_fewer_than_three_masters_is_refused() {
    let error = ClusterSpec::new(2, 0).try_start().unwrap_err();
    assert!(error.message().contains("at least 3 masters"), "{error}");
}
