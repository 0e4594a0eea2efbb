//! A Redis Cluster on loopback, Envoy's `redis_proxy` in front of it, and Webdis in front of that: the
//! path the filter's callouts take when the shim talks to a cluster (`docs/scaling.md`, "Redis Cluster").
//!
//! ```no_run
//! use wasm_test::cluster::{ClusterShim, ClusterOpts, ProxyOpts};
//! use wasm_test::redis_cmd;
//!
//! // 3 masters + 3 replicas of Debian's redis-server, `redis-cli --cluster create`, cluster_state:ok;
//! // then an Envoy (`--disable-hot-restart`) whose TCP listener runs envoy.filters.network.redis_proxy
//! // to an `envoy.clusters.redis` cluster seeded with every node; then Webdis at that listener.
//! let mut shim = ClusterShim::start(ClusterOpts::default(), ProxyOpts::default());
//! let master = shim.cluster.master_of("tg:q:{acme}:2026-11");
//! redis_cmd(shim.proxy.port, &["SET", "tg:q:{acme}:2026-11", "5"]).unwrap(); // routed by Envoy
//! let killed_at = shim.cluster.kill(master);                                   // SIGKILL by PID
//! let promoted = shim.cluster.wait_failover(master, std::time::Duration::from_secs(30)).unwrap();
//! ```
//!
//! - [`RedisCluster`]: the nodes (own ports, own directories, `--cluster-enabled yes`,
//!   `--cluster-node-timeout`), the topology read from `CLUSTER NODES`, a key's master ([`key_slot`] is
//!   Redis' CRC16 with hash tags), killing a master by PID and waiting for its replica's promotion,
//!   `INFO commandstats` per node.
//! - [`RedisProxy`]: the second Envoy process (no wasm filter), one TCP listener with
//!   `envoy.filters.network.redis_proxy` (`settings: {op_timeout, enable_hashtagging: true,
//!   enable_redirection: true, enable_command_stats: true}`, `prefix_routes.catch_all_route`) to a cluster
//!   of `cluster_type: envoy.clusters.redis` (`lb_policy: CLUSTER_PROVIDED`) whose endpoints are the seed
//!   nodes. It speaks RESP, so [`crate::redis_cmd`] works against its port too.
//! - [`ClusterShim`]: all three, and a [`crate::Webdis`] whose `redis_port` is the proxy's listener.
//!
//! Every process is stopped by PID when its handle drops (Webdis first, then the proxy, then the nodes).

use super::{free_port, http, redis_cmd, tail, terminate, RespValue, TempDir, Webdis};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The slot of a key as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its hash tag (the
/// part between the first `{` and the next `}`, when not empty), modulo [`SLOTS`].
pub fn key_slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &b[open + 1..];
        rest.iter()
            .position(|&c| c == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(b)) % SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

// ---------------------------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------------------------

/// How [`RedisCluster::start`] lays the cluster out.
#[derive(Clone, Debug)]
pub struct ClusterOpts {
    /// Masters (the slots are split evenly between them).
    pub masters: usize,
    /// Replicas per master.
    pub replicas: usize,
    /// `--cluster-node-timeout` (ms): how long a master may be unreachable before it is failed over.
    pub node_timeout_ms: u64,
    /// `--appendonly yes --appendfsync everysec` (else no persistence at all).
    pub appendonly: bool,
}

impl Default for ClusterOpts {
    /// 3 masters, 1 replica each, node timeout 2000 ms, no AOF.
    fn default() -> Self {
        ClusterOpts {
            masters: 3,
            replicas: 1,
            node_timeout_ms: 2000,
            appendonly: false,
        }
    }
}

/// One `redis-server` of the cluster.
pub struct ClusterNode {
    /// Client port.
    pub port: u16,
    /// Cluster bus port (`--cluster-port`).
    pub bus_port: u16,
    child: Child,
    dir: PathBuf,
    alive: bool,
}

impl ClusterNode {
    /// PID of the process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it was not killed by [`RedisCluster::kill`].
    pub fn alive(&self) -> bool {
        self.alive
    }

    /// Contents of its redis.log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node id.
    pub id: String,
    /// Client port.
    pub port: u16,
    /// Flagged `master`.
    pub master: bool,
    /// Flagged `fail` or `fail?` (or `noaddr`).
    pub failed: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

/// A running Redis Cluster on loopback (every node killed by PID on drop).
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    opts: ClusterOpts,
    /// Nodes killed, with the slots they served then.
    killed_slots: Vec<(u16, Vec<(u16, u16)>)>,
    // Declared last: removed after the processes are gone.
    dir: TempDir,
}

/// Spawns one cluster node of `bin` on `port` (cluster bus on `bus_port`), its files in `node_dir`.
fn spawn_node(bin: &str, opts: &ClusterOpts, node_dir: &Path, port: u16, bus_port: u16) -> Child {
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-port", &bus_port.to_string()])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", &opts.node_timeout_ms.to_string()])
        // A replica syncs at once (not after the default 5 s wait for more replicas).
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--save", "", "--daemonize", "no"])
        .arg("--dir")
        .arg(node_dir)
        .arg("--logfile")
        .arg(node_dir.join("redis.log"));
    if opts.appendonly {
        cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {bin} (apt-get install redis-server): {e}"))
}

impl RedisCluster {
    /// Starts `masters × (1 + replicas)` nodes of `$REDIS_SERVER` (default `redis-server`) on free
    /// loopback ports, joins them with `$REDIS_CLI` (default `redis-cli`) `--cluster create …
    /// --cluster-replicas N --cluster-yes`, and waits (60 s) until every node reports
    /// `cluster_state:ok` and every replica's link to its master is up. Panics with the logs otherwise.
    pub fn start(opts: ClusterOpts) -> RedisCluster {
        let dir = TempDir::new("cluster");
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let count = opts.masters * (1 + opts.replicas);
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let node_dir = dir.path().join(format!("node{i}"));
            fs::create_dir_all(&node_dir).unwrap_or_else(|e| panic!("{}: {e}", node_dir.display()));
            let (port, bus_port) = (free_port(), free_port());
            let child = spawn_node(&bin, &opts, &node_dir, port, bus_port);
            nodes.push(ClusterNode {
                port,
                bus_port,
                child,
                dir: node_dir,
                alive: true,
            });
        }
        let mut cluster = RedisCluster {
            nodes,
            opts,
            killed_slots: Vec::new(),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..cluster.nodes.len() {
            loop {
                let port = cluster.nodes[i].port;
                // Alive first: another process may answer on the port this node failed to bind.
                if let Ok(Some(st)) = cluster.nodes[i].child.try_wait() {
                    // A free port another test took between the pick and the bind: new ports
                    // (bounded).
                    let log = cluster.nodes[i].log();
                    if log.matches("Address already in use").count() <= 4
                        && log.contains("Address already in use")
                    {
                        let (port, bus_port) = (free_port(), free_port());
                        let node = &mut cluster.nodes[i];
                        node.child = spawn_node(&bin, &cluster.opts, &node.dir, port, bus_port);
                        node.port = port;
                        node.bus_port = bus_port;
                        continue;
                    }
                    panic!("cluster node on {port} exited {st}: {log}");
                }
                if matches!(redis_cmd(port, &["PING"]), Ok(RespValue::Simple(ref s)) if s == "PONG")
                {
                    break;
                }
                if Instant::now() >= deadline {
                    panic!("cluster node not answering PING on {port}");
                }
                thread::sleep(Duration::from_millis(30));
            }
        }
        cluster.create();
        if let Err(e) = cluster.wait_ok(Duration::from_secs(60)) {
            panic!("cluster not ok: {e}\n{}", cluster.logs_tail());
        }
        cluster
    }

    /// `redis-cli --cluster create` (bounded: 60 s, then killed by PID).
    fn create(&mut self) {
        let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let out_path = self.dir.path().join("create.log");
        let out = fs::File::create(&out_path).unwrap_or_else(|e| panic!("create.log: {e}"));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("create.log: {e}"));
        let mut child = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &self.opts.replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {cli}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st;
            }
            if Instant::now() >= deadline {
                terminate(&mut child, Duration::from_millis(200));
                panic!(
                    "redis-cli --cluster create did not finish in 60 s:\n{}",
                    fs::read_to_string(&out_path).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(50));
        };
        let text = fs::read_to_string(&out_path).unwrap_or_default();
        if !status.success() || !text.contains("[OK] All 16384 slots covered") {
            panic!("redis-cli --cluster create failed ({status}):\n{text}");
        }
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Ports of the nodes not killed.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.port)
            .collect()
    }

    /// Every node's port (the seeds of a proxy).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The node with that port.
    pub fn node(&self, port: u16) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.port == port)
    }

    /// `CLUSTER NODES` as seen by the first live node that answers.
    pub fn topology(&self) -> Result<Vec<NodeInfo>, String> {
        let mut last = String::from("no live node");
        for port in self.live_ports() {
            match redis_cmd(port, &["CLUSTER", "NODES"]) {
                Ok(v) => match v.as_str() {
                    Some(text) => return Ok(parse_cluster_nodes(&text)),
                    None => last = format!("CLUSTER NODES on {port}: {v:?}"),
                },
                Err(e) => last = format!("CLUSTER NODES on {port}: {e}"),
            }
        }
        Err(last)
    }

    /// Ports of the masters that serve slots and are not flagged failed.
    pub fn masters(&self) -> Vec<u16> {
        self.topology()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect()
    }

    /// The port of the master serving `slot` (None while no live master serves it).
    pub fn master_of_slot(&self, slot: u16) -> Option<u16> {
        self.topology().ok()?.into_iter().find_map(|n| {
            (n.master && !n.failed && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
                .then_some(n.port)
        })
    }

    /// The port of the master that holds `key`; panics when no live master serves its slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = key_slot(key);
        self.master_of_slot(slot)
            .unwrap_or_else(|| panic!("no live master serves slot {slot} (key {key})"))
    }

    /// The port of a replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> Option<u16> {
        let topo = self.topology().ok()?;
        let id = topo.iter().find(|n| n.port == master_port)?.id.clone();
        topo.iter()
            .find(|n| !n.master && !n.failed && n.master_id.as_deref() == Some(id.as_str()))
            .map(|n| n.port)
    }

    /// A command on the master that holds `key` (no proxy in between).
    pub fn cmd_for_key(&self, key: &str, args: &[&str]) -> Result<RespValue, String> {
        redis_cmd(self.master_of(key), args)
    }

    /// `GET key` on its master, as an integer (None when absent).
    pub fn get_int(&self, key: &str) -> Option<i64> {
        match self.cmd_for_key(key, &["GET", key]) {
            Ok(v) => v.as_int(),
            Err(e) => panic!("GET {key}: {e}"),
        }
    }

    /// The keys matching `pattern` on every live master (KEYS: for tests only).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut out = Vec::new();
        for port in self.masters() {
            if let Ok(RespValue::Array(Some(v))) = redis_cmd(port, &["KEYS", pattern]) {
                out.extend(v.iter().filter_map(RespValue::as_str));
            }
        }
        out.sort();
        out
    }

    /// SIGKILL to the node on `port`, by PID, reaped; returns when it was sent. The slots it served
    /// (read just before) are kept for [`wait_failover`](Self::wait_failover).
    pub fn kill(&mut self, port: u16) -> Instant {
        let slots = self
            .topology()
            .ok()
            .and_then(|t| t.into_iter().find(|n| n.port == port))
            .map(|n| n.slots)
            .unwrap_or_default();
        self.killed_slots.push((port, slots));
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"));
        let at = Instant::now();
        let _ = Command::new("kill")
            .args(["-KILL", &node.child.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = node.child.wait();
        node.alive = false;
        at
    }

    /// Whether the cluster is whole: every live node says `cluster_state:ok`, the live masters serve all
    /// 16384 slots, and every live replica's link to its master is up. Err says what is missing.
    pub fn check_ok(&self) -> Result<(), String> {
        for port in self.live_ports() {
            let info = redis_cmd(port, &["CLUSTER", "INFO"])
                .ok()
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {port}: not cluster_state:ok"));
            }
        }
        let topo = self.topology()?;
        let live = self.live_ports();
        let mut covered = 0u32;
        for n in topo
            .iter()
            .filter(|n| n.master && !n.failed && live.contains(&n.port))
        {
            covered += n
                .slots
                .iter()
                .map(|&(a, b)| u32::from(b) - u32::from(a) + 1)
                .sum::<u32>();
        }
        if covered != u32::from(SLOTS) {
            return Err(format!("live masters serve {covered} slots"));
        }
        let replicas: Vec<&NodeInfo> = topo
            .iter()
            .filter(|n| !n.master && live.contains(&n.port))
            .collect();
        let want = self.opts.replicas * self.opts.masters;
        let have =
            (self.nodes.iter().filter(|n| n.alive).count()).saturating_sub(self.opts.masters);
        if replicas.len() < want.min(have) {
            return Err(format!(
                "{} replicas, want {}",
                replicas.len(),
                want.min(have)
            ));
        }
        for n in replicas {
            let info = redis_cmd(n.port, &["INFO", "replication"])
                .ok()
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            if !info.contains("master_link_status:up") {
                return Err(format!("replica {}: link to its master not up", n.port));
            }
        }
        Ok(())
    }

    /// Polls [`check_ok`](Self::check_ok) every 50 ms until it passes (returns the time it took) or
    /// `timeout` passes (returns the last reason).
    pub fn wait_ok(&self, timeout: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            match self.check_ok() {
                Ok(()) => return Ok(t0.elapsed()),
                Err(e) if t0.elapsed() >= timeout => return Err(e),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// After [`kill`](Self::kill) of the master on `killed`: waits (bounded, polling every 20 ms) until
    /// another live node serves its first slot as master and every live node says `cluster_state:ok`.
    /// Returns the new master's port.
    pub fn wait_failover(&self, killed: u16, timeout: Duration) -> Result<u16, String> {
        let t0 = Instant::now();
        let probe_slot = self
            .killed_slots
            .iter()
            .find(|(p, _)| *p == killed)
            .and_then(|(_, s)| s.first().map(|r| r.0));
        loop {
            let promoted = probe_slot
                .and_then(|s| self.master_of_slot(s))
                .filter(|&p| p != killed);
            let states_ok = self.live_ports().iter().all(|&p| {
                redis_cmd(p, &["CLUSTER", "INFO"])
                    .ok()
                    .and_then(|v| v.as_str())
                    .is_some_and(|s| s.contains("cluster_state:ok"))
            });
            match promoted {
                Some(p) if states_ok => return Ok(p),
                _ if t0.elapsed() >= timeout => {
                    return Err(format!(
                        "slots of {killed} not served by a promoted replica after {timeout:?} \
                         (probe slot {probe_slot:?}); topology {:?}",
                        self.topology()
                    ))
                }
                _ => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// `INFO commandstats` of the node on `port`: command name (`eval`, `evalsha`, `script|load`, …) →
    /// calls. Empty when the node does not answer.
    pub fn commandstats(&self, port: u16) -> BTreeMap<String, u64> {
        let text = redis_cmd(port, &["INFO", "commandstats"])
            .ok()
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        parse_commandstats(&text)
    }

    /// Script calls (`eval` + `evalsha`, `calls=`) summed over every live node since the last
    /// [`reset_stats`](Self::reset_stats). Replicas apply a script's effects, not the script, so only
    /// masters count; a killed node's calls are gone with it.
    pub fn script_calls(&self) -> u64 {
        self.live_ports()
            .into_iter()
            .map(|p| {
                let s = self.commandstats(p);
                s.get("eval").copied().unwrap_or(0) + s.get("evalsha").copied().unwrap_or(0)
            })
            .sum()
    }

    /// `CONFIG RESETSTAT` on every live node.
    pub fn reset_stats(&self) {
        for p in self.live_ports() {
            let _ = redis_cmd(p, &["CONFIG", "RESETSTAT"]);
        }
    }

    /// The last lines of every node's log (for failure messages).
    pub fn logs_tail(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.port, tail(&n.log(), 15)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            terminate(&mut n.child, Duration::from_secs(2));
        }
    }
}

/// Parses `CLUSTER NODES` text (lines `<id> <ip:port@bus> <flags> <master> … <slot ranges>`).
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeInfo {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags
                    .iter()
                    .any(|x| *x == "fail" || *x == "fail?" || *x == "noaddr"),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            })
        })
        .collect()
}

/// Parses `INFO commandstats` text: `cmdstat_<name>:calls=N,…` → name → N.
pub fn parse_commandstats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Envoy's redis_proxy
// ---------------------------------------------------------------------------------------------

/// How [`RedisProxy::start`] configures Envoy's `redis_proxy` and its `envoy.clusters.redis` cluster.
#[derive(Clone, Debug)]
pub struct ProxyOpts {
    /// `settings.op_timeout` (ms): a command without an answer by then gets an error.
    pub op_timeout_ms: u64,
    /// `cluster_refresh_rate` (ms): how often Envoy re-reads the topology (`CLUSTER SLOTS`).
    pub refresh_ms: u64,
    /// `failure_refresh_threshold` (0: off): upstream failures that trigger a topology refresh.
    pub failure_refresh_threshold: u32,
    /// `redirect_refresh_threshold` (0: off): MOVED/ASK answers that trigger a topology refresh.
    pub redirect_refresh_threshold: u32,
    /// `--concurrency`.
    pub concurrency: u32,
}

impl Default for ProxyOpts {
    /// op_timeout 1 s, topology refreshed every 1 s and after 1 failure or 1 redirection, 1 worker.
    fn default() -> Self {
        ProxyOpts {
            op_timeout_ms: 1000,
            refresh_ms: 1000,
            failure_refresh_threshold: 1,
            redirect_refresh_threshold: 1,
            concurrency: 1,
        }
    }
}

/// The bootstrap of a [`RedisProxy`]: `{{…}}` placeholders filled by [`RedisProxy::start`].
pub const PROXY_TEMPLATE: &str = r#"admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: {{ADMIN_PORT}} }
static_resources:
  listeners:
  - name: redis_listener
    address:
      socket_address: { address: 127.0.0.1, port_value: {{PORT}} }
    enable_reuse_port: false
    filter_chains:
    - filters:
      - name: envoy.filters.network.redis_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.redis_proxy.v3.RedisProxy
          stat_prefix: tg_redis
          settings:
            op_timeout: {{OP_TIMEOUT}}
            enable_hashtagging: true
            enable_redirection: true
            enable_command_stats: true
          prefix_routes:
            catch_all_route: { cluster: redis_cluster }
  clusters:
  - name: redis_cluster
    connect_timeout: 1s
    lb_policy: CLUSTER_PROVIDED
    cluster_type:
      name: envoy.clusters.redis
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.clusters.redis.v3.RedisClusterConfig
        cluster_refresh_rate: {{REFRESH}}
        cluster_refresh_timeout: 0.5s
        failure_refresh_threshold: {{FAILURE_REFRESH}}
        redirect_refresh_threshold: {{REDIRECT_REFRESH}}
    load_assignment:
      cluster_name: redis_cluster
      endpoints:
      - lb_endpoints:
{{SEEDS}}
"#;

/// A second Envoy process: a RESP listener with `envoy.filters.network.redis_proxy` in front of a Redis
/// Cluster (killed by PID on drop).
pub struct RedisProxy {
    /// The RESP listener (point Webdis' `redis_port` here).
    pub port: u16,
    /// Admin port.
    pub admin_port: u16,
    child: Child,
    log_path: PathBuf,
    yaml: PathBuf,
    // Declared last: removed after the process is gone.
    dir: TempDir,
}

impl RedisProxy {
    /// Renders [`PROXY_TEMPLATE`] with the seed ports, runs [`crate::envoy_bin`] with
    /// `--disable-hot-restart`, waits (20 s) for admin `/ready` LIVE, then (30 s) until an `EVAL` of a
    /// key on each of the `probe_keys` succeeds through the listener (Envoy has read the topology).
    pub fn start(
        seeds: &[u16],
        probe_keys: &[&str],
        opts: &ProxyOpts,
    ) -> Result<RedisProxy, String> {
        let dir = TempDir::new("redis-proxy");
        let (port, admin_port) = (free_port(), free_port());
        let secs = |ms: u64| format!("{}s", ms as f64 / 1000.0);
        let seeds_yaml: String = seeds
            .iter()
            .map(|p| {
                format!(
                    "        - endpoint:\n            address:\n              socket_address: \
                     {{ address: 127.0.0.1, port_value: {p} }}\n"
                )
            })
            .collect();
        let text = PROXY_TEMPLATE
            .replace("{{ADMIN_PORT}}", &admin_port.to_string())
            .replace("{{PORT}}", &port.to_string())
            .replace("{{OP_TIMEOUT}}", &secs(opts.op_timeout_ms))
            .replace("{{REFRESH}}", &secs(opts.refresh_ms))
            .replace(
                "{{FAILURE_REFRESH}}",
                &opts.failure_refresh_threshold.to_string(),
            )
            .replace(
                "{{REDIRECT_REFRESH}}",
                &opts.redirect_refresh_threshold.to_string(),
            )
            .replace("{{SEEDS}}", seeds_yaml.trim_end());
        let yaml = dir.path().join("redis-proxy.yaml");
        fs::write(&yaml, text).map_err(|e| format!("write {}: {e}", yaml.display()))?;
        let log_path = dir.path().join("envoy.log");
        let log = fs::File::create(&log_path).map_err(|e| format!("envoy.log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("envoy.log: {e}"))?;
        let bin = crate::envoy_bin();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&yaml)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .arg("--disable-hot-restart")
            .args(["-l", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log2))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot spawn envoy {}: {e}", bin.display()))?;
        let mut proxy = RedisProxy {
            port,
            admin_port,
            child,
            log_path,
            yaml,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = proxy.child.try_wait() {
                return Err(format!(
                    "redis proxy envoy exited {st}:\n{}",
                    tail(&proxy.log(), 30)
                ));
            }
            if let Ok(r) = http::request(
                admin_port,
                "GET",
                "/ready",
                &[],
                b"",
                Duration::from_millis(500),
            ) {
                if r.status == 200 && r.text().trim() == "LIVE" {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "redis proxy envoy not LIVE after 20 s:\n{}",
                    tail(&proxy.log(), 30)
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for key in probe_keys {
            loop {
                let r = redis_cmd(port, &["EVAL", "return 1", "1", key]);
                if matches!(r, Ok(RespValue::Int(1))) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "EVAL through the redis proxy still fails for {key}: {r:?}\n{}",
                        tail(&proxy.log(), 30)
                    ));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(proxy)
    }

    /// PID of the Envoy process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Contents of its log.
    pub fn log(&self) -> String {
        fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The rendered bootstrap.
    pub fn bootstrap_path(&self) -> &Path {
        &self.yaml
    }

    /// The temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Counters and gauges from admin `/stats?format=json` whose name starts with `prefix`
    /// (e.g. `redis.tg_redis.command.eval.` → `…total`, `…success`, `…error`).
    pub fn stats(&self, prefix: &str) -> BTreeMap<String, u64> {
        let Ok(r) = http::get(self.admin_port, "/stats?format=json", &[]) else {
            return BTreeMap::new();
        };
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v.get("stats")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let name = s.get("name")?.as_str()?;
                let value = s.get("value")?.as_u64()?;
                name.starts_with(prefix).then(|| (name.to_string(), value))
            })
            .collect()
    }

    /// One counter (0 when absent), e.g. `redis.tg_redis.command.evalsha.total`.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats(name).get(name).copied().unwrap_or(0)
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(2));
    }
}

// ---------------------------------------------------------------------------------------------
// All three
// ---------------------------------------------------------------------------------------------

/// Keys whose hash tags land on three different thirds of the slot space, so a probe `EVAL` of each
/// reaches each master of a 3-master cluster (`{a}` 15495, `{b}` 3300, `{c}` 7365).
pub const PROBE_KEYS: [&str; 3] = ["tg:probe:{a}", "tg:probe:{b}", "tg:probe:{c}"];

/// Webdis → Envoy `redis_proxy` → Redis Cluster. Dropped in that order.
pub struct ClusterShim {
    /// Webdis, whose `redis_port` is the proxy's listener (the filter's `webdis` cluster points here).
    pub webdis: Webdis,
    /// The Envoy running `redis_proxy`.
    pub proxy: RedisProxy,
    /// The nodes.
    pub cluster: RedisCluster,
}

impl ClusterShim {
    /// Starts the cluster, the proxy (seeded with every node) and Webdis; panics with logs on failure.
    pub fn start(copts: ClusterOpts, popts: ProxyOpts) -> ClusterShim {
        let cluster = RedisCluster::start(copts);
        let proxy = RedisProxy::start(&cluster.ports(), &PROBE_KEYS, &popts)
            .unwrap_or_else(|e| panic!("redis proxy: {e}"));
        let webdis = Webdis::start(proxy.port);
        ClusterShim {
            webdis,
            proxy,
            cluster,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slot_follows_redis_cluster_hash_tags() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
        assert_eq!(key_slot("tg:q:{acme}:2026-11"), key_slot("acme"));
    }

    #[test]
    fn cluster_nodes_and_commandstats_parse() {
        let text = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                    b2 127.0.0.1:7002@17002 slave a1 0 1 1 connected\n\
                    c3 127.0.0.1:7003@17003 master,fail - 0 1 2 disconnected 5461 5462-10922\n";
        let n = parse_cluster_nodes(text);
        assert_eq!(n.len(), 3);
        assert_eq!((n[0].port, n[0].master, n[0].failed), (7001, true, false));
        assert_eq!(n[0].slots, vec![(0, 5460)]);
        assert_eq!(n[1].master_id.as_deref(), Some("a1"));
        assert!(n[2].failed);
        assert_eq!(n[2].slots, vec![(5461, 5461), (5462, 10922)]);
        let s = parse_commandstats(
            "# Commandstats\r\ncmdstat_eval:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n\
             cmdstat_script|load:calls=1,usec=1\r\n",
        );
        assert_eq!(s.get("eval"), Some(&3));
        assert_eq!(s.get("script|load"), Some(&1));
    }
}
