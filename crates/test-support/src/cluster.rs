//! [`RedisCluster`]: a throwaway Redis Cluster, masters and replicas, built
//! with `redis-cli --cluster create`, whose masters can be killed to watch a
//! replica take over.

use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::thread;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::resp;
use crate::server::RedisServer;

/// How long a new or changed cluster has to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The shape of a cluster to start: see [`ClusterSpec::new`].
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    masters: usize,
    replicas: usize,
    node_timeout: Duration,
    full_coverage: bool,
}

impl ClusterSpec {
    /// `masters` masters (at least 3, as `redis-cli --cluster create`
    /// requires), each with `replicas` replicas. A node that does not answer
    /// for `node_timeout` (1 s by default) is failed over: a replica takes
    /// over in about two seconds. Full coverage is not required by default
    /// (`cluster-require-full-coverage no`): while a master is down, the
    /// other masters keep serving their slots, so a test sees one failure
    /// domain go, not the whole cluster.
    pub fn new(masters: usize, replicas: usize) -> Self {
        Self {
            masters,
            replicas,
            node_timeout: Duration::from_millis(1000),
            full_coverage: false,
        }
    }

    /// `cluster-node-timeout` (at least 100 ms).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout.max(Duration::from_millis(100));
        self
    }

    /// `cluster-require-full-coverage`: with `true`, every node refuses
    /// every command (CLUSTERDOWN) while some slot has no live master.
    pub fn require_full_coverage(mut self, required: bool) -> Self {
        self.full_coverage = required;
        self
    }

    /// Starts the cluster with the backend the environment chooses
    /// ([`Backend::from_env`]).
    ///
    /// # Panics
    ///
    /// With the reason (and the nodes' logs), if it cannot be started.
    pub fn start(&self) -> RedisCluster {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ClusterSpec::start`], as a `Result`.
    pub fn try_start(&self) -> Result<RedisCluster> {
        self.start_with(&Backend::from_env()?)
    }

    /// Starts every node with `backend`, creates the cluster, and waits until
    /// every node reports `cluster_state:ok` and every replica is linked to
    /// its master.
    pub fn start_with(&self, backend: &Backend) -> Result<RedisCluster> {
        if self.masters < 3 {
            return Err(Error::new(format!(
                "a Redis Cluster needs at least 3 masters, not {}",
                self.masters
            )));
        }
        let args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &self.node_timeout.as_millis().to_string(),
            "--cluster-require-full-coverage",
            if self.full_coverage { "yes" } else { "no" },
        ]
        .map(str::to_owned)
        .into();
        let count = self.masters * (1 + self.replicas);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(RedisServer::launch(backend, &args, true, None)?);
        }
        let cluster = RedisCluster { nodes };

        let mut create: Vec<String> = vec!["--cluster".into(), "create".into()];
        create.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port())),
        );
        create.extend([
            "--cluster-replicas".into(),
            self.replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        // Its long report matters only when it fails, and the error holds it.
        cluster.nodes[0]
            .redis_cli(&create)
            .map_err(|e| e.context("creating the Redis Cluster"))?;
        cluster.try_wait_until_ok()?;
        Ok(cluster)
    }
}

/// A running Redis Cluster on loopback ports (never 6379, bus ports at
/// +10000), every node stopped when it is dropped. Start one with
/// [`RedisCluster::start`] or a [`ClusterSpec`].
///
/// Like [`RedisServer`], its methods block and panic with the nodes' view
/// when something does not happen in time.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// A cluster node as the cluster sees it (a line of `CLUSTER NODES`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Its loopback port.
    pub port: u16,
    /// A master (else a replica).
    pub master: bool,
    /// A replica's master's id.
    pub master_id: Option<String>,
    /// Flagged `fail` (or `fail?`: suspected) by the node that was asked.
    pub failed: bool,
    /// The slots it serves (masters).
    pub slots: Vec<RangeInclusive<u16>>,
}

/// A master killed by [`RedisCluster::kill_master`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KilledMaster {
    /// Its index in [`RedisCluster::nodes`].
    pub node: usize,
    /// Its port.
    pub port: u16,
    /// Its cluster id.
    pub id: String,
    /// The slots it served.
    pub slots: Vec<RangeInclusive<u16>>,
}

/// What [`RedisCluster::wait_for_failover`] saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Failover {
    /// The port of the node that now serves the killed master's slots.
    pub new_master: u16,
    /// From the call until every live node agreed.
    pub waited: Duration,
}

impl RedisCluster {
    /// `ClusterSpec::new(masters, replicas).start()`: e.g. `start(3, 1)` for
    /// 3 masters and 3 replicas.
    ///
    /// # Panics
    ///
    /// As [`ClusterSpec::start`].
    pub fn start(masters: usize, replicas: usize) -> Self {
        ClusterSpec::new(masters, replicas).start()
    }

    /// Every node, masters and replicas, in their order of creation.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`, to kill, pause or restart it. After a restart, call
    /// [`wait_until_ok`](Self::wait_until_ok) for it to rejoin.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Every node's `redis://127.0.0.1:<port>/` (any of them is a seed for a
    /// cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The cluster as a running, unpaused node sees it.
    pub fn topology(&self) -> Result<Vec<ClusterNode>> {
        let mut last = Error::new("no node of the cluster is running unpaused");
        for node in self.live_nodes() {
            match node.command(&["CLUSTER", "NODES"]) {
                Ok(text) => return parse_nodes(&text),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn live_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && !n.is_paused())
    }

    /// The current masters that serve slots and are not failed, ordered by
    /// the first slot they serve.
    fn masters(&self) -> Result<Vec<ClusterNode>> {
        let mut masters: Vec<ClusterNode> = self
            .topology()?
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.slots.iter().map(|s| *s.start()).min());
        Ok(masters)
    }

    /// The index in [`nodes`](Self::nodes) of master `i`, masters ordered by
    /// the first slot they serve (master 0 serves slot 0).
    ///
    /// # Panics
    ///
    /// If there is no such master.
    pub fn master_index(&self, i: usize) -> usize {
        let masters = self.masters().unwrap_or_else(|e| panic!("{e}"));
        let master = masters.get(i).unwrap_or_else(|| {
            panic!(
                "there is no master {i}: the cluster has {} live masters",
                masters.len()
            )
        });
        self.index_of(master.port)
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| {
                panic!("no node of this cluster has port {port}")
            })
    }

    /// Kills master `i` (ordered as in [`master_index`](Self::master_index))
    /// with no warning, as [`RedisServer::kill`]. Its replica, if it has one,
    /// takes over once the others have not heard from it for the node
    /// timeout: see [`wait_for_failover`](Self::wait_for_failover).
    ///
    /// # Panics
    ///
    /// If there is no such master, or it could not be killed.
    pub fn kill_master(&mut self, i: usize) -> KilledMaster {
        let masters = self.masters().unwrap_or_else(|e| panic!("{e}"));
        let master = masters.get(i).unwrap_or_else(|| {
            panic!(
                "there is no master {i}: the cluster has {} live masters",
                masters.len()
            )
        });
        let node = self.index_of(master.port);
        self.nodes[node].kill();
        KilledMaster {
            node,
            port: master.port,
            id: master.id.clone(),
            slots: master.slots.clone(),
        }
    }

    /// Waits until every running node flags the killed master as failed,
    /// sees its slots served by another live master, and reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s (e.g. the master had no replica),
    /// with every live node's view of the cluster.
    pub fn wait_for_failover(&self, killed: &KilledMaster) -> Failover {
        let started = Instant::now();
        let slot = killed.slots.first().map_or(0, |range| *range.start());
        loop {
            if let Some(new_master) = self.failed_over(killed, slot) {
                return Failover {
                    new_master,
                    waited: started.elapsed(),
                };
            }
            if started.elapsed() >= SETTLE_TIMEOUT {
                panic!(
                    "no replica took over the slots of the master on port {} within {} s; \
                     the cluster as each live node sees it:\n{}",
                    killed.port,
                    SETTLE_TIMEOUT.as_secs(),
                    self.views()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The new master's port, if every live node agrees that `slot` moved
    /// from the killed master to it.
    fn failed_over(&self, killed: &KilledMaster, slot: u16) -> Option<u16> {
        let mut agreed = None;
        for node in self.live_nodes() {
            let info = node.command(&["CLUSTER", "INFO"]).ok()?;
            if resp::info_field(&info, "cluster_state") != Some("ok") {
                return None;
            }
            let view =
                parse_nodes(&node.command(&["CLUSTER", "NODES"]).ok()?).ok()?;
            let dead = view.iter().find(|n| n.id == killed.id)?;
            if !dead.failed {
                return None;
            }
            let owner = view.iter().find(|n| {
                n.master
                    && !n.failed
                    && n.slots.iter().any(|s| s.contains(&slot))
            })?;
            if owner.id == killed.id
                || agreed.is_some_and(|port| port != owner.port)
            {
                return None;
            }
            agreed = Some(owner.port);
        }
        agreed
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok`
    /// and knows every node, and every replica among them is linked to its
    /// master, as both see it (`master_link_status:up` on the replica,
    /// `state=online` on the master): after the creation, or after a killed
    /// node was restarted.
    ///
    /// A write may still reach a replica up to a second later: after a
    /// diskless full sync, a master holds the writes for a replica it has
    /// put online until that replica's next `REPLCONF ACK` (they are sent
    /// once a second). Before killing a master, make sure of a write with
    /// `WAIT` sent over the write's own connection
    /// ([`RedisServer::commands`]).
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s, with every live node's view.
    pub fn wait_until_ok(&self) {
        self.try_wait_until_ok().unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_wait_until_ok(&self) -> Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !self.settled() {
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "the Redis Cluster did not settle within {} s (cluster_state:ok, every node \
                     known, replicas linked); as each live node sees it:\n{}",
                    SETTLE_TIMEOUT.as_secs(),
                    self.views()
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn settled(&self) -> bool {
        let known = self.nodes.len().to_string();
        self.live_nodes().all(|node| {
            let Ok(info) = node.command(&["CLUSTER", "INFO"]) else {
                return false;
            };
            if resp::info_field(&info, "cluster_state") != Some("ok")
                || resp::info_field(&info, "cluster_known_nodes")
                    != Some(known.as_str())
            {
                return false;
            }
            let Ok(replication) = node.command(&["INFO", "replication"]) else {
                return false;
            };
            match resp::info_field(&replication, "role") {
                Some("master") => replicas_online(&replication),
                _ => {
                    resp::info_field(&replication, "master_link_status")
                        == Some("up")
                }
            }
        })
    }

    /// `CLUSTER INFO` and `CLUSTER NODES` of every live node, for a failure.
    fn views(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let _ = writeln!(text, "--- {node}:");
            if !node.is_running() {
                let _ = writeln!(text, "(killed)");
                continue;
            }
            if node.is_paused() {
                let _ = writeln!(text, "(paused)");
                continue;
            }
            for command in [["CLUSTER", "INFO"], ["CLUSTER", "NODES"]] {
                match node.command(&command) {
                    Ok(reply) => {
                        let reply = reply.lines().filter(|l| {
                            !l.starts_with("cluster_stats")
                                && !l.starts_with("total_cluster")
                        });
                        for line in reply {
                            let _ = writeln!(text, "{}", line.trim_end());
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(text, "{e}");
                    }
                }
            }
        }
        text
    }
}

/// Whether a master's `INFO replication` shows every replica it has
/// `state=online`. A replica reports `master_link_status:up` once it has
/// loaded the snapshot, up to a `serverCron` tick (100 ms) before its master
/// has seen the snapshot's child end and put it online (it shows
/// `wait_bgsave` until then).
fn replicas_online(replication: &str) -> bool {
    let count: usize = resp::info_field(replication, "connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (0..count).all(|i| {
        resp::info_field(replication, &format!("slave{i}")).is_some_and(
            |fields| fields.split(',').any(|field| field == "state=online"),
        )
    })
}

/// Parses `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master|-> <ping> <pong> <epoch> <link> <slot>...`
fn parse_nodes(text: &str) -> Result<Vec<ClusterNode>> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let bad = || {
                Error::new(format!("unexpected CLUSTER NODES line {line:?}"))
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return Err(bad());
            }
            let address = fields[1].split(['@', ',']).next().ok_or_else(bad)?;
            let port = address
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse().ok())
                .ok_or_else(bad)?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                // `[slot->-node]` entries are migrations in progress.
                .filter(|s| !s.starts_with('['))
                .map(|s| {
                    let (start, end) = s.split_once('-').unwrap_or((s, s));
                    Ok(start.parse().map_err(|_| bad())?
                        ..=end.parse().map_err(|_| bad())?)
                })
                .collect::<Result<_>>()?;
            Ok(ClusterNode {
                id: fields[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_is_settled_once_it_has_put_every_replica_online() {
        let waiting = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
slave0:ip=127.0.0.1,port=16799,state=online,offset=0,lag=0\r\n\
slave1:ip=127.0.0.1,port=16800,state=wait_bgsave,offset=0,lag=0\r\n\
master_repl_offset:0\r\n";
        assert!(!replicas_online(waiting));
        assert!(replicas_online(&waiting.replace("wait_bgsave", "online")));
        assert!(replicas_online(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"
        ));
    }

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002,host2 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 1426238316232 0 5 disconnected 10923 10924-16383
";
        let nodes = parse_nodes(text).unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].port, 30004);
        assert!(!nodes[0].master);
        assert_eq!(
            nodes[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(nodes[1].port, 30002);
        assert_eq!(nodes[1].slots, vec![5461..=10922]);
        assert!(nodes[2].master && !nodes[2].failed);
        assert_eq!(nodes[2].slots, vec![0..=5460]);
        assert!(nodes[3].failed);
        assert_eq!(nodes[3].slots, vec![10923..=10923, 10924..=16383]);
    }
}
