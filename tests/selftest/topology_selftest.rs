//! Self-test of the multi-server topologies (`tests/support/topology.rs`), against real
//! `redis-server` (and `redis-cli`) processes.

use crate::support;

use std::collections::HashSet;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::topology::{Cluster, Role, SentinelSet, role, start_independent};
use support::{RedisServer, Reply, wait_until_every};

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.as_bytes().to_vec()))
}

/// Wait (up to 10 s) until `GET key` on the replica `server` answers `value`.
fn assert_replicated(server: &RedisServer, key: &str, value: &str) {
    let replicated = wait_until_every(Duration::from_secs(10), Duration::from_millis(10), || {
        server.cmd(&["GET", key]) == bulk(value)
    });
    assert!(
        replicated,
        "{key} = {value} did not reach the replica on port {}: {:?}",
        server.port(),
        role(server)
    );
}

#[test]
fn sentinel_set_comes_up_and_fails_over() {
    let started = Instant::now();
    let set = SentinelSet::start();
    eprintln!("sentinel set started in {:?}", started.elapsed());

    assert_eq!(set.master_name, "mymaster");
    assert_eq!(set.sentinels.len(), 3);
    let urls = set.sentinel_urls();
    let ports: HashSet<u16> = set.sentinels.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 3, "sentinel ports must be distinct: {urls:?}");
    for (url, sentinel) in urls.iter().zip(&set.sentinels) {
        assert_eq!(*url, format!("redis://127.0.0.1:{}/", sentinel.port()));
        assert_eq!(role(sentinel), Ok(Role::Sentinel));
        assert_eq!(sentinel.known_sentinels("mymaster").unwrap().len(), 2);
        assert_eq!(sentinel.known_replicas("mymaster").unwrap().len(), 1);
        let config = std::fs::read_to_string(sentinel.config_path()).unwrap();
        assert!(config.contains("sentinel monitor mymaster 127.0.0.1"));
    }
    assert_eq!(
        set.master_addr(),
        ("127.0.0.1".to_string(), set.primary.port())
    );
    assert_eq!(set.current_master().port(), set.primary.port());
    assert_eq!(role(&set.primary), Ok(Role::Master));
    assert!(matches!(
        role(&set.replica),
        Ok(Role::Replica { master_port, .. }) if master_port == set.primary.port()
    ));

    // Data written to the primary reaches the replica.
    assert_eq!(set.primary.cmd(&["SET", "topology:before", "1"]), ok());
    assert_replicated(&set.replica, "topology:before", "1");

    let failover_started = Instant::now();
    let new_port = set.failover();
    eprintln!("failover took {:?}", failover_started.elapsed());
    assert_eq!(new_port, set.replica.port());
    assert_eq!(set.master_addr().1, set.replica.port());
    assert_eq!(set.current_master().port(), set.replica.port());
    assert_eq!(role(&set.replica), Ok(Role::Master));
    assert_eq!(set.replica.cmd(&["GET", "topology:before"]), bulk("1"));
    assert_eq!(set.replica.cmd(&["SET", "topology:after", "2"]), ok());

    // The sentinels reconfigure the old primary as a replica of the new master (they
    // wait ~8 s after the failover before doing so).
    let demotion_started = Instant::now();
    let demoted = wait_until_every(Duration::from_secs(30), Duration::from_millis(50), || {
        matches!(
            role(&set.primary),
            Ok(Role::Replica { master_port, .. }) if master_port == new_port
        )
    });
    assert!(
        demoted,
        "the old primary did not become a replica of port {new_port}: {:?}\n{}",
        role(&set.primary),
        set.diagnostics()
    );
    eprintln!(
        "old primary became a replica {:?} later",
        demotion_started.elapsed()
    );
    assert_replicated(&set.primary, "topology:after", "2");
}

#[test]
fn cluster_of_three_routes_keys_and_reshards() {
    let started = Instant::now();
    let cluster = Cluster::start(3);
    eprintln!("cluster of 3 started in {:?}", started.elapsed());

    assert_eq!(cluster.nodes.len(), 3);
    let urls = cluster.urls();
    for (url, node) in urls.iter().zip(&cluster.nodes) {
        assert_eq!(*url, format!("redis://127.0.0.1:{}/", node.port()));
        let info = node.cmd(&["CLUSTER", "INFO"]).as_string().unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
    let ids = cluster.node_ids();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 3, "{ids:?}");
    assert!(
        ids.iter()
            .all(|id| id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit())),
        "{ids:?}"
    );
    assert_eq!(cluster.slot_counts().iter().sum::<usize>(), 16384);
    assert!(cluster.slot_counts().iter().all(|&n| n > 5000));

    // Well-known CRC16 slots, and hash tags.
    assert_eq!(cluster.slot_of("foo"), 12182);
    assert_eq!(cluster.slot_of("bar"), 5061);
    assert_eq!(cluster.slot_of("{foo}:lock"), 12182);

    let key = "topology:{route}";
    let slot = cluster.slot_of(key);
    let owner = cluster.node_for_slot(slot);
    assert_eq!(cluster.nodes[owner].cmd(&["SET", key, "v1"]), ok());
    assert_eq!(cluster.nodes[owner].cmd(&["GET", key]), bulk("v1"));
    let moved = format!("MOVED {slot} 127.0.0.1:{}", cluster.nodes[owner].port());
    for (i, node) in cluster.nodes.iter().enumerate() {
        if i != owner {
            assert_eq!(node.cmd(&["GET", key]), Reply::Error(moved.clone()));
        }
    }
    assert_eq!(cluster.keys_total(), vec![key.to_string()]);
    // Redirected commands count as rejected, not as calls.
    assert_eq!(cluster.command_calls_total("set"), 1);
    assert_eq!(cluster.command_calls_total("get"), 1);

    // Move 50 slots from one node to another.
    let (from, to) = (0, 2);
    let before = cluster.slot_ranges();
    let counts_before = cluster.slot_counts();
    let reshard_started = Instant::now();
    cluster.reshard(from, to, 50);
    eprintln!("reshard of 50 slots took {:?}", reshard_started.elapsed());
    let counts_after = cluster.slot_counts();
    assert_eq!(counts_after[from], counts_before[from] - 50);
    assert_eq!(counts_after[to], counts_before[to] + 50);
    assert_eq!(counts_after[1], counts_before[1]);

    let owner_in = |ranges: &[(u16, u16, usize)], slot: u16| {
        ranges
            .iter()
            .find(|&&(start, end, _)| (start..=end).contains(&slot))
            .map(|&(_, _, node)| node)
    };
    let after = cluster.slot_ranges();
    let moved_slots: Vec<u16> = (0..16384u16)
        .filter(|&slot| owner_in(&before, slot) != owner_in(&after, slot))
        .collect();
    assert_eq!(moved_slots.len(), 50);
    assert!(
        moved_slots
            .iter()
            .all(|&s| owner_in(&before, s) == Some(from) && owner_in(&after, s) == Some(to))
    );
    assert!(moved_slots.iter().all(|&s| cluster.node_for_slot(s) == to));

    // A key in a moved slot is now accepted by `to` and redirected by `from`.
    let moved_key = (0..100_000)
        .map(|i| format!("topology:moved:{i}"))
        .find(|k| moved_slots.contains(&cluster.slot_of(k)))
        .expect("no key hashes into a moved slot");
    let slot = cluster.slot_of(&moved_key);
    assert_eq!(cluster.nodes[to].cmd(&["SET", &moved_key, "v2"]), ok());
    assert_eq!(
        cluster.nodes[from].cmd(&["GET", &moved_key]),
        Reply::Error(format!(
            "MOVED {slot} 127.0.0.1:{}",
            cluster.nodes[to].port()
        ))
    );
    let mut want = vec![key.to_string(), moved_key];
    want.sort();
    assert_eq!(cluster.keys_total(), want);
}

#[test]
fn independent_servers_are_distinct_primaries() {
    let started = Instant::now();
    let servers = start_independent(5);
    eprintln!("5 independent servers started in {:?}", started.elapsed());

    assert_eq!(servers.len(), 5);
    let ports: HashSet<u16> = servers.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 5, "ports must be distinct: {ports:?}");
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(role(server), Ok(Role::Master));
        assert_eq!(server.cmd(&["SET", "which", &i.to_string()]), ok());
    }
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server.cmd(&["GET", "which"]), bulk(&i.to_string()));
        assert_eq!(server.dbsize(), 1);
    }

    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    drop(servers);
    for addr in addrs {
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
            "{addr} still accepts connections after drop"
        );
    }
}
